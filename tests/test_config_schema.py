"""Every analyzer setting is checked against its rule (type, finite, range, relations between
keys); a bad config file is refused whole, at start and at a live reload, naming key, value and
rule, and the running analyzer keeps the settings in force."""

from __future__ import annotations

import logging
import math
import os
import queue
import re
import subprocess
import sys
import threading
import time
from dataclasses import fields
from pathlib import Path

import pytest

from analyzer.config import AnalyzerConfig, ConfigError, load_config
from analyzer.config_schema import RELATIONS, RULES, problems
from analyzer.service.config_watch import ConfigWatcher
from rankscope.store import EmbeddedStore

# (TOML line, key, value as the message shows it, words of the rule)
BAD = [
    ("z = nan", "z", "nan", "z is a finite number > 0"),
    ("reference_quantile = 5.0", "reference_quantile", "5.0", "in (0, 1)"),
    ("baseline_warmup = 0", "baseline_warmup", "0", "baseline_warmup is an integer in [1,"),
    ("abs_ratio = inf", "abs_ratio", "inf", "abs_ratio is a finite number > 1"),
    ("l1_threshold = inf", "l1_threshold", "inf", "finite number > 0"),
    ("transient_z = -inf", "transient_z", "-inf", "finite number > 0"),
    ("l1_window = 0", "l1_window", "0", "l1_window is an integer in [3,"),
    ("l2_window = 0", "l2_window", "0", "l2_window is an integer in [1,"),
    ("smooth = 0", "smooth", "0", "smooth is an integer in [1,"),
    ("history = 0", "history", "0", "history is an integer in [1,"),
    ("z = 'high'", "z", "'high'", "wrong type, str"),
    ("baseline_warmup = 2.5", "baseline_warmup", "2.5", "not an integer"),
    ("history = true", "history", "True", "wrong type, bool"),
    ("z = [6.0]", "z", "[6.0]", "wrong type, list"),
    ("cv_treshold = 0.5", "cv_treshold", "0.5", "did you mean cv_threshold?"),
    ("spike_ratio = 1.2", "abs_ratio", "1.5", "abs_ratio <= spike_ratio"),
    ("l1_min_history = 30", "l1_min_history", "30", "l1_min_history <= l1_window"),
]


def test_every_setting_has_a_rule_and_the_defaults_keep_them():
    assert set(RULES) == {f.name for f in fields(AnalyzerConfig)}
    defaults = AnalyzerConfig()
    assert problems({f.name: getattr(defaults, f.name) for f in fields(defaults)}) == []
    for rel in RELATIONS:
        assert rel.lower in RULES and rel.upper in RULES


@pytest.mark.parametrize("key", sorted(RULES))
def test_each_rule_refuses_non_finite_wrong_types_and_values_out_of_range(key):
    rule = RULES[key]
    for value in (float("nan"), float("inf"), -float("inf"), "1", None, True, [1]):
        assert problems({key: value}), f"{key} = {value!r} was accepted"
    assert problems({key: rule.low - 1})  # below the range
    if rule.kind is int:
        assert problems({key: float(rule.low)}) and not problems({key: rule.low})
    if rule.high is not None:
        assert problems({key: rule.high + 1})


@pytest.mark.parametrize("line, key, shown, rule", BAD, ids=[b[0] for b in BAD])
def test_a_bad_value_is_refused_naming_key_value_and_rule(tmp_path, line, key, shown, rule):
    path = tmp_path / "analyzer.toml"
    path.write_text(f"[analyzer]\nmin_change = 0.5\n{line}\n")  # a good change beside it
    with pytest.raises(ValueError) as err:
        load_config(path)
    text = str(err.value)
    assert str(path) in text and "refused" in text and f"{key} = {shown}" in text and rule in text, text


def test_every_breach_of_a_file_is_named_at_once():
    with pytest.raises(ConfigError) as err:
        AnalyzerConfig().with_overrides(z=math.nan, reference_quantile=5.0, baseline_warmup=0)
    assert sorted(p.key for p in err.value.problems) == ["baseline_warmup", "reference_quantile", "z"]


def test_good_values_and_edges_pass():
    cfg = AnalyzerConfig().with_overrides(z=7, reference_quantile=0.5, spike_ratio=1.5,
                                          l1_min_history=20, reopen_within=0, event_lookback=0)
    assert cfg.z == 7.0 and isinstance(cfg.z, float) and cfg.spike_ratio == cfg.abs_ratio
    with pytest.raises(ConfigError, match="must not be negative"):
        AnalyzerConfig(z=-1)


class Log:
    """The lines a process writes to stderr, waited for one by one (bounded)."""

    def __init__(self, proc: subprocess.Popen):
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=lambda: [self.lines.put(x) for x in proc.stderr], daemon=True).start()

    def wait_for(self, text: str, timeout_s: float = 60.0) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no line with {text!r}; saw: {''.join(self.seen[-20:])}") from None
            self.seen.append(line)
            if text in line:
                return line


def _analyze(tmp_path: Path, config: Path, *extra: str) -> subprocess.Popen:
    db = tmp_path / "store.db"
    if not db.exists():
        EmbeddedStore(db).close()
    env = {k: v for k, v in os.environ.items() if k != "RANKSCOPE_STORE"}
    return subprocess.Popen([sys.executable, "-m", "rankscope.cli", "-v", "analyze", "--config",
                             str(config), "--store", str(db), "--quiet", *extra],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)


@pytest.mark.parametrize("mode", [["--once"], ["--every", "1s"]])
def test_analyze_refuses_a_bad_file_at_start(tmp_path, mode):
    config = tmp_path / "bad.toml"
    config.write_text("[analyzer]\nz = nan\nreference_quantile = 5.0\nbaseline_warmup = 0\n")
    proc = _analyze(tmp_path, config, *mode)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "Traceback" not in err, err
    for named in ("z = nan: not finite", "reference_quantile = 5.0: out of range (rule: "
                  "reference_quantile is a finite number in (0, 1))", "baseline_warmup = 0"):
        assert named in err, err


def test_a_running_analyzer_refuses_a_bad_reload_and_keeps_its_settings(tmp_path):
    config = tmp_path / "analyzer.toml"
    config.write_text("[analyzer]\nz = 6.0\n")
    proc = _analyze(tmp_path, config, "--every", "1s")
    log = Log(proc)
    try:
        log.wait_for("analyzing")
        config.write_text("[analyzer]\nz = nan\nbaseline_warmup = 0\nabs_ratio = inf\n")
        refused = log.wait_for("config reload refused")
        for named in ("z = nan: not finite (rule: z is a finite number > 0)",
                      "baseline_warmup = 0: out of range", "abs_ratio = inf: not finite"):
            assert named in refused, refused
        config.write_text("[analyzer]\nz = 7.0\n")
        assert "z 6.0 -> 7.0" in log.wait_for("reloaded:")  # z was still 6.0, not nan
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(30)


def test_the_watcher_keeps_the_settings_in_force_when_a_reload_is_refused(tmp_path, caplog):
    config = tmp_path / "analyzer.toml"
    config.write_text("[analyzer]\nmin_change = 0.5\n")
    watcher = ConfigWatcher(config)
    caplog.set_level(logging.INFO, logger="rankscope.analyze")
    for line, key, shown, rule in BAD:
        config.write_text(f"[analyzer]\nmin_change = 0.9\n{line}\n")  # refused whole
        assert watcher.poll() is None and watcher.config == AnalyzerConfig(min_change=0.5)
        message = caplog.records[-1].getMessage()
        assert "reload refused" in message and f"{key} = {shown}" in message and rule in message


def test_the_docs_give_every_rule():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "analyzer.md").read_text(encoding="utf-8")
    for key, rule in RULES.items():
        assert re.search(rf"^\| `{key}`( \(restart\))? \| [^|]+ \| {re.escape(str(rule))} \|", doc, re.M), key
    for rel in RELATIONS:
        assert f"`{rel.lower} <= {rel.upper}`" in doc

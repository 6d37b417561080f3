"""`rankscope demo` end to end (on a smaller built-in; `make demo` runs IL-0477 at full scale)."""

import os
import subprocess
import sys


def test_demo_prints_l1_l2_verdict_and_writes_the_report(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RANKSCOPE_STORE"}
    out = subprocess.run(
        [sys.executable, "-m", "rankscope.cli", "demo", "--scenario", "link-degradation",
         "--report", str(tmp_path / "report")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    assert "L1 (iteration time): a step at iteration 15" in text
    assert "Verdict: link degradation on node 97 (ranks 776-783)" in text
    assert "Event 'NIC link flapping' on node 97: SUPPORTED" in text
    assert (tmp_path / ".rankscope" / "demo.db").exists()        # the embedded store by default
    assert (tmp_path / "report" / "index.html").exists()

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
    # the host of node 97 (the simulator's default host names), which an operator drains
    assert "Verdict: link degradation on gpu-node-00097 (ranks 776-783, node 97)" in text
    assert "Event 'NIC link flapping' on gpu-node-00097: SUPPORTED" in text
    # the core's advice for the class, as `analyze --once` and the report give it
    assert "Action: Check the NIC / links of gpu-node-00097" in text
    # the dry-run plan for the culprit node, then its swap and the recovery, with its times
    assert ("Action plan (dry-run, slurm): drain gpu-node-00097 for ld-15-r776: planned: would run: scontrol "
            "update NodeName=gpu-node-00097 State=DRAIN Reason=\"rankscope ld-15-r776: link_degradation") in text
    assert "restarts with node 97 on gpu-spare-00097" in text
    recovery = text.strip().splitlines()[-1]
    assert recovery.startswith("Recovery: time to detect ") and "how: node_swap" in recovery
    assert "time to recover not yet" not in recovery and "(within 10% of the what-if" in recovery
    assert (tmp_path / ".rankscope" / "demo.db").exists()        # the embedded store by default
    assert (tmp_path / "report" / "index.html").exists()

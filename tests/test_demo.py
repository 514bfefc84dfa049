"""`python -m cufold demo` reproduces seed 002's demonstration layout and numbers."""

import re
import subprocess
import sys

import numpy as np


def test_demo_output_is_consistent():
    run = subprocess.run([sys.executable, "-m", "cufold", "demo", "--seed", "7"], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "REDUCTION AND SCAN DEMONSTRATION:" in out and "MAX-REDUCE DEMONSTRATION:" in out
    assert "running on" in out

    def block(title):
        lines = out.split(title, 1)[1].strip("\n").splitlines()[:10]
        assert all(re.match(r"^ {3,4}\d{1,2}: ", ln) for ln in lines), lines
        return np.array([int(v) for ln in lines for v in ln.split(":", 1)[1].split()])

    first = block("Input array:")
    assert len(first) == 100 and first.min() >= 0 and first.max() <= 9
    total = int(re.search(r"Reduction total: (\d+)", out).group(1))
    assert total == first.sum()
    excl = block("Exclusive scan:")
    np.testing.assert_array_equal(excl, np.concatenate([[0], np.cumsum(first)[:-1]]))
    assert int(re.search(r"Scan total: (\d+)", out).group(1)) == total
    second = block("MAX-REDUCE DEMONSTRATION:\n\nInput array:")
    np.testing.assert_array_equal(block("Inclusive max scan:"), np.maximum.accumulate(second))
    assert int(re.search(r"Max reduction: (\d+)\.", out).group(1)) == second.max()
    # seed 002's layout: the row offset right-aligned in 5 columns, values in 4 after a space.
    assert "\n    0:  " in out

"""Rewrite the test modules' asserts as pytest does, once, across the cores, before pytest runs.

pytest rewrites each test module's asserts as it imports it and keeps the result in `__pycache__`
(tests/conftest.py lets it where PYTHONDONTWRITEBYTECODE is set). Every worker of the suite collects the
whole tree, so in a fresh clone the three workers rewrite every module side by side: about 7 s of CPU
each. Done here first, the workers read the result. The files are the ones pytest itself reads (its
name and tag, the source's hash checked on every read); a current one is left alone. This uses pytest's
own private functions: if they change, the script says so and exits 0, and pytest rewrites as before.
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rewrite(path: Path) -> bool:
    """Write the rewritten module at `path` where pytest looks for it; False if it was current."""
    from _pytest.assertion.rewrite import PYC_TAIL, _read_pyc, _rewrite_test, _write_pyc_fp, get_cache_dir

    pyc = get_cache_dir(path) / (path.name[:-3] + PYC_TAIL)
    if _read_pyc(path, pyc) is not None:
        return False
    source_hash, code = _rewrite_test(path, None)  # no config: the default options, as pyproject keeps them
    pyc.parent.mkdir(exist_ok=True)
    partial = pyc.with_name(f"{pyc.name}.{os.getpid()}")
    with partial.open("wb") as out:
        _write_pyc_fp(out, source_hash, code)
    partial.replace(pyc)  # atomic, as pytest writes them: a worker reads the old file or the new one
    return True


def main() -> int:
    # pytest's default python_files (pyproject.toml sets none) and the conftest files.
    modules = sorted(
        path
        for path in (ROOT / "tests").rglob("*.py")
        if "node_modules" not in path.parts
        and (path.name.startswith("test_") or path.name.endswith("_test.py") or path.name == "conftest.py")
    )
    try:
        with ProcessPoolExecutor(os.cpu_count()) as pool:
            written = sum(pool.map(rewrite, modules, chunksize=8))
    except Exception as exc:  # an optimisation only: pytest rewrites whatever is missing
        print(f"scripts/rewrite_asserts.py: left to pytest ({exc!r})", file=sys.stderr)
        return 0
    print(f"scripts/rewrite_asserts.py: {written} of {len(modules)} test modules rewritten", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""README's Python API block runs as written (so the documented calls stay true)."""

import pathlib
import re


def test_readme_python_api_block_runs():
    text = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = text.split("## Python API", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "README's Python API section should hold exactly one python block"
    namespace = {}
    exec(compile(blocks[0], "README.md (Python API)", "exec"), namespace)  # noqa: S102 - our own README
    result = namespace["result"]
    assert result.status == "certified" and result.certificate.error_bound < 1e-8

"""The one output check (pipelines.io.outputs): an output never is, holds or lies inside an input."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.errors import ConfigError
from pipelines.io.outputs import check_output, store_path


def test_an_output_that_is_holds_or_lies_inside_an_input_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (tmp_path / "alias").symlink_to(data)
    cases = {
        str(data): "is --input",
        str(tmp_path / "alias"): "is --input",  # a second name of the same folder
        str(data / "sub" / "out"): "lies inside --input",
        str(tmp_path): "holds --input",
    }
    for output, problem in cases.items():
        with pytest.raises(ConfigError, match=f"^--output: .*{problem} .*Fix: write to a new folder"):
            check_output(output, [("--model", None), ("--input", str(data))])
    check_output(str(tmp_path / "data2"), [("--input", str(data))])  # a sibling sharing a prefix is fine


def test_an_existing_file_is_refused_as_a_folder_output(tmp_path: Path) -> None:
    note = tmp_path / "note.txt"
    note.write_text("x")
    with pytest.raises(ConfigError, match="is an existing file"):
        check_output(str(note))
    check_output(str(note), folder=False)
    check_output(str(tmp_path / "new"))


def test_store_path_is_the_lmdb_directory() -> None:
    assert store_path("lmdb:///a/b?map_size_gb=2") == "/a/b"
    assert store_path("out/store") == "out/store"
    assert store_path("redis://127.0.0.1:16379/0") is None and store_path(None) is None

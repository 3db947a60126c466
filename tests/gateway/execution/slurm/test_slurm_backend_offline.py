"""The Slurm backend's parts that need no cluster: host lists read as Slurm prints them, and `jobgate up --backend
slurm` refusing in one line what it cannot use."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from gateway.cli.up import up
from gateway.execution.slurm.hostlist import expand


@pytest.mark.parametrize(("hostlist", "names"), [
    ("n001", ["n001"]),
    ("n[001-003,007]", ["n001", "n002", "n003", "n007"]),
    ("n[08-10],gpu1", ["n08", "n09", "n10", "gpu1"]),  # the width of the first number is kept
    ("", []),
])
def test_a_host_list_is_the_node_names_slurm_means(hostlist: str, names: list[str]) -> None:
    assert expand(hostlist) == names


def test_a_host_list_it_cannot_read_is_refused_not_guessed() -> None:
    with pytest.raises(ValueError, match="not a number"):
        expand("n[a-c]")


def test_up_on_slurm_without_its_slurm_conf_says_so_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    missing = tmp_path / "no-such" / "slurm.conf"
    result = CliRunner().invoke(up, ["--backend", "slurm", "--data-dir", str(tmp_path / "var"), "--port", str(port)],
                                env={"JOBGATE_SLURM_CONF": str(missing)})
    assert result.exit_code == 1, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith("Error: cannot start on Slurm") and f"no slurm.conf at {missing}" in line

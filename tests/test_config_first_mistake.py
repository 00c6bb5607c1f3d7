"""Issue 30, finding 5: config errors name the real mistake first."""

from __future__ import annotations

from pathlib import Path

import pytest
from clitools import cvs_in_process

from orchestrator.config import ConfigError, load_cluster
from orchestrator.config.documents import parse_document

TYPO = """\
name: t
hosts:
- name: h1
  address: 127.0.0.1
container:
  imgae: img:1
  name: c
"""


def test_an_unknown_key_and_its_suggestion_come_before_the_required_key_it_hides(
    tmp_path: Path,
) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(TYPO)
    with pytest.raises(ConfigError) as caught:
        load_cluster(path)
    assert str(caught.value) == (
        f"{path}:6: container.imgae: unknown key (did you mean 'image'?) (and 1 more problem)"
    )


def test_validate_lists_every_problem(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(TYPO)
    proc = cvs_in_process("validate", "-c", str(path), "--no-check-files")
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[1:] == [
        f"  - {path}:6: container.imgae: unknown key (did you mean 'image'?)",
        f"  - {path}:5: container.image: required key is missing",
    ], proc.stderr


@pytest.mark.parametrize(
    ("text", "advice"),
    [
        (
            "hosts:\n- name: h1\n  address: a\n - name: h2\n   address: b\n",
            "this list item is indented 1 spaces, unlike the list it is in: indent it 0 "
            "spaces, like the item on line 2 ('- name: h1')",
        ),
        (
            "hosts:\n  - name: h1\n    address: a\n   - name: h2\n     address: b\n",
            "this list item is indented 3 spaces, unlike the list it is in: indent it 2 "
            "spaces, like the item on line 2 ('- name: h1')",
        ),
        (
            "hosts:\n  - name: h1\n    address: a\n - name: h2\n   address: b\n",
            "this list item is indented 1 spaces, unlike the list it is in: indent it 2 "
            "spaces, like the item on line 2 ('- name: h1')",
        ),
    ],
    ids=["one-space-in", "one-space-more", "one-space-less"],
)
def test_a_misindented_list_item_is_told_the_indentation_of_its_list(
    text: str, advice: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_document(text, "c.yaml")
    assert advice in str(caught.value), caught.value

"""YAML structure errors point at the line where the structure broke, in words
a person uses, with the line shown (issue 25; orchestrator/config/yaml_words.py)."""

from __future__ import annotations

import pytest

from orchestrator.config.documents import ConfigError, parse_document


@pytest.mark.parametrize(
    ("text", "where", "words", "line_shown"),
    [
        pytest.param(
            "hosts: [a]\ncontainer:\n\timage: x\n",
            "c.yaml:3:1:",
            "a tab indents this line: YAML indents with spaces only",
            r'line 3: "\timage: x"',
            id="tab",
        ),
        pytest.param(
            "hosts: [a]\ncontainer:\n  image:x\n  name: y\n",
            "c.yaml:3:",
            "no space after the colon: YAML reads 'image:x' as one word; write 'image: x'",
            'line 3: "  image:x"',
            id="missing-space-after-colon",
        ),
        pytest.param(
            "hosts: [a]\ncontainer:\n  image: x\n  lifetime:persistent\n",
            "c.yaml:4:",
            "write 'lifetime: persistent'",
            'line 4: "  lifetime:persistent"',
            id="missing-space-after-colon-last-key",
        ),
        pytest.param(
            "name: x\nhosts: [a]\ncontainer:\n  image: x\n  sshd:\n    port: 1\n   enabled: auto\n",
            "c.yaml:7:4:",
            "indented 3 spaces, which lines up with no key above it: indent it 4 to go with "
            "'port', 2 to go with 'sshd', 0 to go with 'container'",
            'line 7: "   enabled: auto"',
            id="mixed-indentation-between-levels",
        ),
        pytest.param(
            "hosts: [a]\ncontainer:\n  image: x\n   name: y\n",
            "c.yaml:4:4:",
            "this line is indented under nothing: line 3 ('image: x') already has a value",
            'line 4: "   name: y"',
            id="mixed-indentation-under-a-value",
        ),
        pytest.param(
            "hosts: [a, b\ncontainer:\n  image: x\n",
            "c.yaml:1:",
            "the '[' opened on this line is never closed: end it with ']'",
            'line 1: "hosts: [a, b"',
            id="unclosed-bracket",
        ),
        pytest.param(
            "ssh: {user: x\nhosts: [a]\n",
            "c.yaml:1:",
            "the '{' opened on this line is never closed: end it with '}'",
            'line 1: "ssh: {user: x"',
            id="unclosed-brace",
        ),
    ],
)
def test_a_yaml_mistake_is_explained_at_its_line(
    text: str, where: str, words: str, line_shown: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_document(text, "c.yaml")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(where), message
    assert words in message, message
    assert line_shown in message, message
    assert "<block" not in message and "while parsing" not in message


def test_a_mistake_not_known_here_keeps_the_parsers_words() -> None:
    with pytest.raises(ConfigError) as info:
        parse_document("a: *nowhere\n", "c.yaml")
    assert "nowhere" in str(info.value)

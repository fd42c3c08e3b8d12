"""Env families (``<prefix>/*`` entry points): listed as one row without importing their package,
members resolved on use, the install line when the package is missing. No ecosystem package needed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium
import pytest

import agentgym
from agentgym import cli
from agentgym.registry import ENVS, UnknownNameError, env_family, env_spec

FAMILY_MODULE = '''
from agentgym.envs.base import TextEnv
from agentgym.registry import EnvFamily, EnvSpec


class Word(TextEnv):
    """Say the word."""

    max_turns = 1

    def __init__(self, word):
        super().__init__()
        self.word = word

    def reset(self, *, seed=None, options=None):
        return [{"role": "user", "content": f"say {self.word}"}], {}

    def step(self, action):
        ok = float(action == self.word)
        return [], 0.0, True, False, {"outcome_reward": ok}


class Words(EnvFamily):
    prefix = "words"
    member_label = "word"
    description = "say a word"
    requires = "{requires}"
    extra = "words"

    def members(self):
        return ["apple", "banana", "cherry"]

    def member_spec(self, member):
        return EnvSpec(name=f"words/{member}", entry_point=Word, kwargs={"word": member}, description=f"say {member}")


FAMILY = Words()
'''


@pytest.fixture(params=["agentgym", "no-such-distribution-xyz"], ids=["installed", "missing"])
def words_family(request, tmp_path, monkeypatch):
    """A throwaway distribution whose entry point ``words/*`` names a family; ``requires`` is a
    distribution that is installed (agentgym) or not."""
    (tmp_path / "words_family.py").write_text(FAMILY_MODULE.replace("{requires}", request.param))
    info = tmp_path / "words_family-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: words-family\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        textwrap.dedent("""
        [agentgym.envs]
        words/* = words_family:FAMILY
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    ENVS.discover(force=True)
    yield request.param == "agentgym"
    ENVS._entries.pop("words/*", None)
    for name in [n for n in ENVS._members if n.startswith("words/")]:
        ENVS._members.pop(name)
        gymnasium.registry.pop(f"agentgym/Words{name.split('/')[1].capitalize()}-v0", None)
    sys.modules.pop("words_family", None)


def test_members_are_made_and_registered_with_gymnasium(words_family):
    if not words_family:
        pytest.skip("the family's package is missing in this variant")
    env = agentgym.make("words/banana")
    assert env.reset()[0][0]["content"] == "say banana" and env.step("banana")[4]["outcome_reward"] == 1.0
    spec = env_spec("words/banana")
    assert spec.package == "words-family" and spec.description == "say banana"
    assert gymnasium.make("agentgym/WordsBanana-v0").reset()[0][0]["content"] == "say banana"
    with pytest.raises(UnknownNameError, match="Did you mean words/banana"):
        agentgym.make("words/bananna")
    assert "words/*" in agentgym.registered() and "words/banana" not in agentgym.registered()


def test_envs_lists_a_family_as_one_row(words_family, capsys):
    assert cli.main(["envs"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("words/<word>"))
    assert "words-family" in row and "say a word" in row
    if words_family:
        assert "`agentgym envs words/` lists them" in row
        assert cli.main(["envs", "words/"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert [line.split()[0] for line in lines[1:]] == ["words/apple", "words/banana", "words/cherry"]
    else:
        assert "no-such-distribution-xyz not installed: pip install 'agentgym[words]'" in row
        assert cli.main(["envs", "words/"]) == 2


def test_a_member_of_a_missing_package_says_how_to_install_it(words_family):
    if words_family:
        pytest.skip("the family's package is installed in this variant")
    with pytest.raises(ImportError, match=r"pip install 'agentgym\[words\]'"):
        agentgym.make("words/apple")


def test_envs_command_imports_no_ecosystem_package():
    """`agentgym envs` lists rg/, ta/ and vf/ without importing reasoning-gym, TextArena or verifiers."""
    code = (
        "import sys; from agentgym import cli; cli.main(['envs']); "
        "print('IMPORTED', [m for m in ('reasoning_gym', 'textarena', 'verifiers') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "IMPORTED []" in out.stdout
    rows = {line.split()[0] for line in out.stdout.splitlines() if line}
    assert {"rg/<task>", "ta/<game>", "vf/<module>", "openenv"} <= rows


def test_builtin_families_resolve_by_prefix():
    assert env_family("rg").prefix == "rg" and env_family("ta/").member_label == "game"
    assert env_family("vf/*").open_ended
    assert Path(sys.modules[type(env_family("vf")).__module__].__file__).name == "verifiers.py"

"""The eval role's sampling defaults (docs/inventory.md): taken where no flag is given, each
flag overriding its own; top-k, top-p, K and the draft policy only above temperature 0;
parity greedy whatever the role says; a bad value one line at load."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.eval.parity.options import ParityOptions
from orchestrator.eval.spec import EvalOptions
from orchestrator.eval.sweep import requested
from orchestrator.inventory import InventoryError, parse_inventory

ROLE = """hosts:
  box:
    roles:
      eval:
        drafters: /d
        temperature: {t}
        top_p: 0.9
        gt_samples: 2
        draft_policy: sample
"""


def role(t: str = "0.8"):
    return parse_inventory(ROLE.format(t=t), Path("inv.yaml")).hosts["box"].eval


def test_the_roles_sampling_is_taken_where_no_flag_is_given():
    r = role()
    s = EvalOptions().sampling(64, r)
    assert (s.temperature, s.top_p, s.completions, s.top_k) == (0.8, 0.9, 2, None)
    assert EvalOptions().engine_for(r).draft_policy == "sample"
    hotter = EvalOptions(temperature=1.0, top_k=5).sampling(64, r)
    assert (hotter.temperature, hotter.top_k, hotter.top_p) == (1.0, 5, 0.9)
    greedy = EvalOptions(temperature=0.0)
    assert greedy.sampling(64, r).to_json() == {"temperature": 0.0, "max_new_tokens": 64}
    assert greedy.engine_for(r).draft_policy == "argmax"
    assert EvalOptions().sampling(64, None).sampled is False
    parity = ParityOptions(samples=2).eval_options()
    assert parity.sampling(64, r).sampled is False


def test_no_temperature_flag_leaves_the_roles():
    temps, t = requested(None)
    assert temps == () and t is None
    assert EvalOptions(temperature=t).sampling(64, role()).temperature == 0.8
    assert requested("0,0.6") == ((0.0, 0.6), 0.6)
    assert requested("0")[1] == 0.0


@pytest.mark.parametrize("t", ["-1", "1000", "hot"])
def test_a_bad_role_temperature_is_one_line(t):
    with pytest.raises(InventoryError) as info:
        role(t)
    assert "\n" not in str(info.value) and "temperature" in str(info.value)

"""notes/walkthrough.md, sections 7 and 8: the 40-line NumPy sampler against npspec's kit, and the exercises' answers.

* The sampler is the first ```python block of section 7, cut out of the page: at most 40 lines, NumPy its only
  import, no npspec. Run in a namespace of its own, its `speculative_round` passes npspec.testing.check_round (the
  reference round on the same uniforms, GPT-2's vocabulary, top-k, top-p and greedy warping); each of three broken
  copies (a non-strict test, no residual, argmax drafts) fails it.
* Every answer of section 8 (the `name = value` spans inside its <details> blocks) equals the value computed here on
  its own: exact fractions for fractions, the printed digits for decimals, npspec's kit for the rules.
"""

import ast
import re
from fractions import Fraction as F

import pytest

from npspec.decode.evaluate import expected_tokens_per_round, predicted_speedup
from npspec.testing import blocks, check_round, constant_table, node_acceptance

from conftest import ROOT

PAGE = ROOT / "notes" / "walkthrough.md"


def section(number):
    text = PAGE.read_text(encoding="utf-8")
    start = text.index(f"\n## {number}. ")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def sampler_source():
    return re.search(r"^```python\n(.*?)^```", section(7), re.S | re.M).group(1)


def run_sampler(source):
    namespace = {"__name__": "walkthrough_sampler"}
    exec(compile(source, str(PAGE), "exec"), namespace)
    return namespace["speculative_round"]


def test_the_sampler_is_forty_lines_of_numpy_only():
    source = sampler_source()
    assert len(source.splitlines()) <= 40
    imports = [n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert [alias.name for n in imports for alias in n.names] == ["numpy"] and "npspec" not in source


def test_the_sampler_passes_the_kit():
    report = check_round(run_sampler(sampler_source()))
    assert report.ok, report.findings
    assert report.trials >= 100


@pytest.mark.parametrize("line, broken", [
    ("if not u[gamma + i] < p[i][d] / q[i][d]:", "if not u[gamma + i] <= p[i][d] / q[i][d]:"),  # non-strict
    ("r = np.maximum(p[i] - q[i], 0.0)", "r = p[i]"),  # no residual: p again after a rejection
    ("drafts = [draw(q[i], u[i]) for i in range(gamma)]", "drafts = [int(np.argmax(q[i])) for i in range(gamma)]"),
], ids=["non-strict", "no-residual", "argmax-drafts"])
def test_the_kit_catches_a_broken_sampler(line, broken):
    source = sampler_source()
    assert line in source
    assert not check_round(run_sampler(source.replace(line, broken))).ok


def quoted_answers():
    """{name: value as written} of every `name = value` span (a number, fraction or tuple of them) inside section
    8's <details> blocks."""
    spans = re.findall(r"<details>(.*?)</details>", section(8), re.S)
    return dict(pair for span in spans for pair in re.findall(r"`(\w+) = ([\d./(), ]+)`", span))


def parse(value):  # "3/5" -> Fraction, "(1/2, 1)" -> [Fraction], "3.51" -> str (decimals compared at their digits)
    if value.startswith("("):
        return [parse(v.strip()) for v in value.strip("()").split(",")]
    return value if "." in value else F(value)


def computed_answers():
    p, q = [F(4, 10), F(3, 10), F(2, 10), F(1, 10)], [F(1, 10), F(2, 10), F(3, 10), F(4, 10)]
    beta = sum(min(a, b) for a, b in zip(p, q))
    residual = [max(F(0), a - b) / (1 - beta) for a, b in zip(p, q)]
    assert [min(a, b) + (1 - beta) * r for a, b, r in zip(p, q, residual)] == p  # the law of one step
    c, v2 = 0.1, 1.2
    alpha = c + v2 - 1  # one draft breaks even here (claim 5)
    assert predicted_speedup(alpha - 1e-9, 1, c, v2) < 1 < predicted_speedup(alpha + 1e-9, 1, c, v2)
    m_star = 4 * 15.9 / 18.1
    # block verification on Sun et al.'s example, drafts (a, b) = (0, 1)
    P, Q = [F(1, 3), F(2, 3)], [F(2, 3), F(1, 3)]
    w1 = min(F(1), P[0] / Q[0])
    w2 = min(F(1), w1 * P[1] / Q[1])
    z1 = sum(max(F(0), w1 * a - b) for a, b in zip(P, Q))
    h = [z1 / (z1 + 1 - w1) if z1 + 1 - w1 else F(1), w2]
    assert blocks.weights([P] * 3, [Q] * 2, (0, 1)) == [1, w1, w2]
    assert [(prob, n) for prob, n, _ in blocks.block_verification_rule([P] * 3, [Q] * 2, (0, 1))] == [(1, 2)]
    table_p, table_q = constant_table(P), constant_table(Q)
    p2, q2 = [F(1, 2), F(1, 2)], [F(3, 4), F(1, 4)]
    return {"beta": beta, "residual": residual,
            "tokens": expected_tokens_per_round(0.8, 4), "speedup": predicted_speedup(0.8, 4, 0.1, 1.2),
            "alpha": alpha, "m_star": m_star, "v8": 8 / float(f"{m_star:.2f}"),
            "w": [w1, w2], "z1": z1, "h": h,
            "token": blocks.expected_accepted(table_p, table_q, (0,), 2, rule=blocks.token_block_rule),
            "block": blocks.expected_accepted(table_p, table_q, (0,), 2, rule=blocks.block_verification_rule),
            "iid": node_acceptance(p2, q2, 2), "rsd": node_acceptance(p2, q2, 2, replacement=False)}


def same(quoted, value):
    if isinstance(quoted, list):
        return len(quoted) == len(value) and all(same(a, b) for a, b in zip(quoted, value))
    if isinstance(quoted, str):  # a decimal: right at the digits printed
        return abs(float(quoted) - float(value)) <= 0.5 * 10 ** -len(quoted.partition(".")[2]) + 1e-12
    return quoted == value


def test_the_exercises_answers():
    quoted, computed = quoted_answers(), computed_answers()
    assert set(quoted) == set(computed)
    wrong = {name: (quoted[name], computed[name]) for name in computed if not same(parse(quoted[name]), computed[name])}
    assert wrong == {}


def test_a_wrong_answer_is_caught():
    assert not same(parse("3/4"), F(3, 5)) and same(parse("2.10"), 2.1016) and not same(parse("2.11"), 2.1016)
    assert not same(parse("(3/4, 1/4, 0)"), [F(3, 4), F(1, 4), F(0), F(0)]) and not same(parse("3.52"), 4 * 15.9 / 18.1)

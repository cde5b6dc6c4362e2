"""Hostile arguments to the Python API of decoding: each gets a TypeError or ValueError naming the argument and what
it accepts, before any forward, instead of an AttributeError from deep inside or a silent acceptance."""

import random
import sys

import numpy as np
import pytest

import npspec
from npspec.decode import BaseDrafter, Proposal, SamplingParams, speculative_generate
from npspec.decode.drafters import MAX_NGRAM, DynamicTreeDrafter, ModelDrafter, NgramDrafter, TreeDrafter
from npspec.sources.errors import CheckpointError, NoCodes
from npspec.model.model import leaves
from npspec.sources.quantize import parse_scheme
from npspec.sources.quantized import quantize_model
from npspec.testing import ScriptedRng, TableModel
from npspec.decode.rules.trees import MAX_TREE_NODES, grow_tree

from conftest import tiny_model
from model_files import saved


@pytest.fixture(scope="module")
def pair():
    return tiny_model(seed=0), tiny_model(seed=1, role="draft", n_layer=1)


@pytest.fixture(scope="module")
def shipped_target():
    return npspec.load(role="target")


def one_line(e):
    text = str(e.value)
    assert "\n" not in text, text
    return text


def test_a_target_that_is_not_a_model_is_named(pair):
    for target in (None, "gpt2", 3):
        with pytest.raises(TypeError, match=r"^target must be an npspec Model \(npspec.load") as e:
            speculative_generate(target, pair[1], [1, 2], 4)
        one_line(e)


@pytest.mark.parametrize("draft", [123, 2.5, True, object()])
def test_a_draft_that_is_neither_a_model_a_drafter_nor_none_is_named(pair, draft):
    with pytest.raises(TypeError, match=r"^draft must be a Model, a drafter \(npspec.decode.drafters\) or None, got ") as e:
        speculative_generate(pair[0], draft, [1, 2], 4)
    one_line(e)


def test_the_cli_word_ngram_as_a_draft_points_to_ngramdrafter(shipped_target):
    with pytest.raises(TypeError, match=r"draft must be .* got the str 'ngram'.*NgramDrafter\(target.config.n_vocab"):
        npspec.generate_text(shipped_target, "ROMEO:", draft="ngram")
    with pytest.raises(TypeError, match="^target must be an npspec Model"):
        npspec.generate_text(None, "ROMEO:")


@pytest.mark.parametrize("shape", ["bogus", "random:tiny", ["tiny"], None])
def test_random_model_names_the_shapes_it_takes(shape):
    with pytest.raises(ValueError, match=r"^unknown shape .*; random_model takes one of gpt2, .*tiny-draft") as e:
        npspec.random_model(shape)  # a KeyError ('bogus'), a TypeError (a list)
    one_line(e)


@pytest.mark.parametrize("kernel", ["", 3])
def test_a_kernel_that_names_no_kernel_is_refused(kernel):
    with pytest.raises(ValueError, match=r"^kernel must be None \(the draft's fastest, measured\) or one of "
                                         r"compiled-panels, .*dequant-panels, compiled-quant, got ") as e:
        npspec.load(role="draft", kernel=kernel)  # "" silently meant the default; None is the default
    one_line(e)


def test_a_kernel_reading_int8_codes_for_float_weights_is_refused_as_the_cli_refuses_it():
    phrase = r"^kernel='dequant-panels' reads a quantized (draft|model)'s int codes, and the \1 .* holds float32 "
    for load in (lambda: npspec.load(role="draft", kernel="dequant-panels"),  # generated with the float weights
                 lambda: npspec.load("fp16:self", "draft", kernel="dequant-panels"),  # not an int scheme
                 lambda: npspec.random_model("tiny", kernel="dequant-panels")):
        with pytest.raises(NoCodes, match=phrase) as e:
            load()
        assert "give an int scheme such as " in one_line(e)
    assert npspec.load("int8-g64:self", "draft", kernel="dequant-panels").kernel == "dequant-panels"


def test_a_draft_model_that_is_not_a_model_is_named_by_the_drafters():
    for make in (ModelDrafter, lambda m: TreeDrafter(m, (2,)), lambda m: DynamicTreeDrafter(m, 4)):
        with pytest.raises(TypeError, match=r"^a draft model must be an npspec Model .*NgramDrafter"):
            make(123)


@pytest.mark.parametrize("rng, error, phrase", [
    (random, TypeError, r"^rng must be an np.random.Generator or an int seed, got <module 'random'.*\(a module\); "
                        r"pass np.random.default_rng\(seed\)"),
    (np.random.RandomState(0), TypeError, r"^rng must be an np.random.Generator .*\(a RandomState\)"),
    ("0", TypeError, r"^rng must be an np.random.Generator"),
    (-1, ValueError, r"^rng \(an int seed\) must be an integer >= 0 or an np.random.Generator, got -1"),
], ids=["module", "RandomState", "str", "negative-seed"])
def test_an_rng_that_is_not_a_generator_or_a_seed_is_named(pair, rng, error, phrase):
    with pytest.raises(error, match=phrase) as e:
        speculative_generate(pair[0], pair[1], [1, 2], 4, rng=rng)
    one_line(e)


class Returning(BaseDrafter):
    """A chain drafter whose propose returns `value`."""

    def __init__(self, value, n_vocab):
        self.value, self.n_vocab = value, n_vocab

    def propose(self, seq, depth, u, sampling):
        return self.value


@pytest.mark.parametrize("value", [None, ([3], None), [3]], ids=["None", "tuple", "list"])
def test_a_drafter_whose_propose_returns_no_proposal_is_named(pair, value):
    drafter = Returning(value, pair[0].config.n_vocab)
    with pytest.raises(TypeError, match=r"^a drafter's propose must return an npspec.decode.Proposal \(the Drafter "
                                        r"protocol, .*got (NoneType|tuple|list) ") as e:
        speculative_generate(pair[0], drafter, [1, 2], 4, gamma=2)  # AttributeError: no .ids
    one_line(e)


def uniform_row(n_vocab, dtype=np.float64, scale=1.0):  # q row 3 > 0
    return np.full(n_vocab, scale / n_vocab, dtype)


@pytest.mark.parametrize("row, phrase", [
    (uniform_row(8, scale=3.0), "sums to 3: "),  # generated, no longer the target's law
    (uniform_row(8, np.float32, 1.001), r"sums to 1.001.* within 0.0001 \(float32 rows\)"),
    (np.r_[0.5, -0.25, 0.25, 0.5, 0, 0, 0, 0], r"holds -0.25 < 0"),
    (np.r_[np.nan, 0.5, 0, 0.5, 0, 0, 0, 0], "holds NaN or inf"),
    (np.r_[np.inf, 0, 0, 1.0, 0, 0, 0, 0], "holds NaN or inf"),
    ([[0.0, 0.0, 0.0, 1.0, 0, 0, 0, 0]], "is list"),
], ids=["sums-to-3", "float32-off", "negative", "nan", "inf", "list"])
def test_a_q_that_is_not_a_distribution_is_refused(row, phrase):
    target = TableModel(lambda seq: np.zeros(8), 8, 40)  # uniform p
    drafter = Returning(Proposal.chain([3], row if isinstance(row, list) else row[None]), 8)
    with pytest.raises(ValueError, match=r"^the drafter's q (row 0 )?" + phrase) as e:
        speculative_generate(target, drafter, [1, 2], 4, gamma=1)
    assert "within 1e-06" in one_line(e) or "float32" in phrase or "list" in phrase


def test_q_rows_are_held_to_the_stated_tolerance(pair):
    n_vocab = pair[0].config.n_vocab
    for dtype, tol in ((np.float64, 1e-6), (np.float32, 1e-4)):
        for off, taken in ((tol / 2, True), (tol * 2, False)):
            drafter = Returning(Proposal.chain([3], uniform_row(n_vocab, dtype, 1 + off)[None]), n_vocab)
            if taken:
                assert len(speculative_generate(pair[0], drafter, [1, 2], 3, gamma=1).ids) == 3
            else:
                with pytest.raises(ValueError, match=rf"summing to 1 within {tol:g} \({np.dtype(dtype)} rows\)"):
                    speculative_generate(pair[0], drafter, [1, 2], 3, gamma=1)


class ShortRng:
    """A source of uniforms whose random(n) returns n - 2 values (none for a round without drafts)."""

    def random(self, n):
        return np.random.default_rng(0).random(max(n - 2, 0))


@pytest.mark.parametrize("drafting", [True, False])
def test_an_rng_that_returns_too_few_uniforms_is_named(pair, drafting):
    with pytest.raises(ValueError, match=r"^rng.random\((7|1)\) returned an array of shape \((5|0),\), expected "
                                         r"shape \(\1,\): the rng must return n uniforms") as e:
        speculative_generate(pair[0], pair[1] if drafting else None, [1, 2], 4, gamma=3, rng=ShortRng())  # IndexError
    one_line(e)


def test_a_generator_a_seed_and_a_scripted_rng_are_still_taken(pair):
    a = speculative_generate(pair[0], pair[1], [1, 2], 4, gamma=2, rng=np.random.default_rng(7))
    b = speculative_generate(pair[0], pair[1], [1, 2], 4, gamma=2, rng=7)
    assert a.ids == b.ids and len(a.ids) == 4
    scripted = ScriptedRng([0.5] * 100)
    speculative_generate(pair[0], None, [1, 2], 2, rng=scripted)
    assert scripted.sizes == [1, 1]


@pytest.mark.parametrize("seed, error", [(-1, ValueError), (1.5, TypeError), (True, TypeError)])
def test_generate_texts_seed_is_named(shipped_target, seed, error):
    with pytest.raises(error, match=r"^seed must be an integer >= 0"):
        npspec.generate_text(shipped_target, "ROMEO:", seed=seed, max_new_tokens=2)


@pytest.mark.parametrize("args, error, phrase", [
    ((0, 0), ValueError, r"^NgramDrafter's n_vocab must be an integer >= 1 \(the target's vocabulary"),
    ((50257, 50257), ValueError, r"^NgramDrafter's eos_token_id \(50257\) is not an id of its vocabulary"),
    ((50257, -1), ValueError, r"^NgramDrafter's eos_token_id must be an integer >= 0 or None"),
    ((50257.0,), TypeError, r"^NgramDrafter's n_vocab must be an integer"),
    ((50257, None, 1, MAX_NGRAM + 1), ValueError, rf"^ngram_max \(--ngram-max\) is at most {MAX_NGRAM}"),
    ((50257, None, 1, 10 ** 12), ValueError, rf"^ngram_max \(--ngram-max\) is at most {MAX_NGRAM}"),
], ids=["zero", "eos-out-of-range", "eos-negative", "float-vocab", "ngram-bound", "ngram-huge"])
def test_ngram_drafter_arguments_are_checked(args, error, phrase):
    with pytest.raises(error, match=phrase):
        NgramDrafter(*args)


def test_ngram_drafter_at_its_largest_size_still_proposes():
    d = NgramDrafter(10, None, MAX_NGRAM, MAX_NGRAM)
    seq = list(range(10)) * 14  # every n-gram of 64 ids recurs 10 ids earlier
    assert d.lookup(seq, 3) == [0, 1, 2]


def test_a_tree_past_the_node_bound_is_refused_before_anything_is_built(pair):
    with pytest.raises(ValueError, match=rf"^the tree 1000000,1000000 has more than {MAX_TREE_NODES} nodes"):
        TreeDrafter(pair[1], (10 ** 6, 10 ** 6))  # 10**12 nodes: counted, never listed
    with pytest.raises(ValueError, match=rf"^a dynamic tree's budget \(--tree-budget\) is at most {MAX_TREE_NODES}"):
        DynamicTreeDrafter(pair[1], MAX_TREE_NODES + 1)
    assert len(TreeDrafter(pair[1], (MAX_TREE_NODES,)).parents) == MAX_TREE_NODES  # the bound itself is a tree


def test_the_dynamic_trees_one_hot_rows_are_those_of_its_ids(pair):
    draft = pair[1]
    drafter = DynamicTreeDrafter(draft, 6, max_children=2)
    drafter.start([1, 2, 3])
    proposal = drafter.propose([1, 2, 3], 3, None, SamplingParams(0.9))
    assert proposal.q is None  # deterministic children: the round builds their one-hot rows, row by row
    ids, q = proposal.ids, proposal.q_rows(draft.config.n_vocab)
    assert q.shape == (6, draft.config.n_vocab) and q.dtype == np.float64
    np.testing.assert_array_equal(q, np.eye(draft.config.n_vocab)[ids])


def test_grow_tree_ranks_an_array_row_as_it_ranks_a_list_ties_to_the_lower_id():
    rng = np.random.default_rng(3)
    for _ in range(20):
        row = rng.integers(0, 4, size=12) / 10.0  # many ties, zeros included
        as_array = grow_tree(lambda path: row, 9, 3, 3)
        assert as_array == grow_tree(lambda path: list(row), 9, 3, 3)


@pytest.mark.slow  # long (>10 s): CI's second step
def test_scheme_prefixes_nested_past_the_recursion_limit_load_as_the_grammar_reads_them(tmp_path):
    d, n, cache = saved(tmp_path / "m"), sys.getrecursionlimit() + 500, tmp_path / "cache"
    deep = npspec.load("int8-ch:" * n + str(d), "draft", kernel="gemm", cache_dir=cache)  # was a RecursionError
    assert deep.source == "int8-ch:" * n + str(d)  # SCHEME:SPEC, SPEC itself SCHEME:SPEC: each prefix quantizes
    two = npspec.load(f"int8-ch:fp16:{d}", "draft", kernel="gemm", cache_dir=cache)
    base = npspec.load(str(d), "draft", kernel="gemm", cache_dir=cache)
    by_hand = quantize_model(quantize_model(base, parse_scheme("fp16")), parse_scheme("int8-ch"))  # innermost first
    assert all(np.array_equal(a, b) for a, b in zip(leaves(two.params), leaves(by_hand.params)))
    with pytest.raises(CheckpointError, match=r"^model 'fp16:self': `self` stands for the target"):
        npspec.load("int8-ch:" * n + "fp16:self", "target", kernel="gemm", cache_dir=cache)

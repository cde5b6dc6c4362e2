"""GPT-2's tensors by name (GPT-2's, without `transformer.`; Conv1D matrices `[d_in, d_out]`; the head tied to
`wte`): which a config asks for, their shapes, the tree the forward reads. Imports the standard library only.
"""

import re

LAYER_NAME = re.compile(r"^(?:transformer\.)?h\.([0-9]+)\.")
BLOCK_MATRICES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def layer_count_problem(config, names, where):
    """A one-line problem if `config`'s n_layer does not fit the layers the file header's `names`
    hold (checked before tensor_shapes builds n_layer-long lists; a few missing are left to check_tensors, more layers
    than n_layer would truncate the model), else None."""
    n_expected = 4 + 12 * config.n_layer
    layers = {int(m.group(1)) for n in names if (m := LAYER_NAME.match(n))}
    if layers and max(layers) >= config.n_layer:
        return (f"{where} says n_layer {config.n_layer:,} but the file holds {max(layers) + 1:,} layers "
                f"(h.0 .. h.{max(layers)}): the model would be truncated")
    if n_expected <= len(names) + 48:
        return None
    present = sum(1 for n in names if n.endswith(".ln_1.weight"))
    return (f"{where} says n_layer {config.n_layer:,} ({n_expected:,} tensors) but the file holds "
            f"{len(names):,} tensors ({present} layers)")


def tensor_shapes(config):  # -> {name: shape} of every tensor the forward uses
    d = config.n_embd
    shapes = {"wte.weight": (config.n_vocab, d), "wpe.weight": (config.n_ctx, d),
              "ln_f.weight": (d,), "ln_f.bias": (d,)}
    for i in range(config.n_layer):
        shapes.update({
            f"h.{i}.ln_1.weight": (d,), f"h.{i}.ln_1.bias": (d,),
            f"h.{i}.attn.c_attn.weight": (d, 3 * d), f"h.{i}.attn.c_attn.bias": (3 * d,),
            f"h.{i}.attn.c_proj.weight": (d, d), f"h.{i}.attn.c_proj.bias": (d,),
            f"h.{i}.ln_2.weight": (d,), f"h.{i}.ln_2.bias": (d,),
            f"h.{i}.mlp.c_fc.weight": (d, 4 * d), f"h.{i}.mlp.c_fc.bias": (4 * d,),
            f"h.{i}.mlp.c_proj.weight": (4 * d, d), f"h.{i}.mlp.c_proj.bias": (d,),
        })
    return shapes


def is_block_matrix(name):  # one of each layer's four matrices (format 2 stores them transposed)
    return name.startswith("h.") and name.endswith(BLOCK_MATRICES)


def params_tree(tensors, config):  # {name: array} -> the checkpoint's tree the forward reads
    def lin(prefix):
        return {"w": tensors[prefix + ".weight"], "b": tensors[prefix + ".bias"]}

    def ln(prefix):
        return {"g": tensors[prefix + ".weight"], "b": tensors[prefix + ".bias"]}

    return {
        "wte": tensors["wte.weight"], "wpe": tensors["wpe.weight"], "ln_f": ln("ln_f"),
        "h": [{"ln_1": ln(f"h.{i}.ln_1"), "ln_2": ln(f"h.{i}.ln_2"),
               "attn": {"c_attn": lin(f"h.{i}.attn.c_attn"), "c_proj": lin(f"h.{i}.attn.c_proj")},
               "mlp": {"c_fc": lin(f"h.{i}.mlp.c_fc"), "c_proj": lin(f"h.{i}.mlp.c_proj")}}
              for i in range(config.n_layer)],
    }


def flat_tensors(params, config):  # params_tree's inverse: {name: array} in tensor_shapes' order, no copies
    t = {"wte.weight": params["wte"], "wpe.weight": params["wpe"],
         "ln_f.weight": params["ln_f"]["g"], "ln_f.bias": params["ln_f"]["b"]}
    for i, h in enumerate(params["h"]):
        for ln in ("ln_1", "ln_2"):
            t[f"h.{i}.{ln}.weight"], t[f"h.{i}.{ln}.bias"] = h[ln]["g"], h[ln]["b"]
        for part, lin in (("attn", "c_attn"), ("attn", "c_proj"), ("mlp", "c_fc"), ("mlp", "c_proj")):
            t[f"h.{i}.{part}.{lin}.weight"], t[f"h.{i}.{part}.{lin}.bias"] = h[part][lin]["w"], h[part][lin]["b"]
    return {name: t[name] for name in tensor_shapes(config)}


def check_tensors(tensors, config):  # -> [str]: each missing or misshaped tensor (empty: all good)
    problems = []
    for name, shape in tensor_shapes(config).items():
        if name not in tensors:
            problems.append(f"missing tensor {name} {list(shape)}")
        elif tuple(tensors[name].shape) != shape:
            problems.append(f"tensor {name} has shape {list(tensors[name].shape)}, expected {list(shape)}")
    return problems

"""Where our override sits among other nodes' attention overrides, and the rule when another sparse node is there.

ComfyUI keeps one `transformer_options["optimized_attention_override"]`; a node that keeps the earlier one wraps it
(ours as `prev`; ComfyUI core's "Model Sparse Attention", comfy_extras/nodes_sparse_attention.py, as the closure
variable `previous`). The core node also re-installs itself on top at every ON_PREPARE_STATE, so in either node
order it ends up first and ours runs inside it.

The rule: the sparse node nearer the sampler (applied later) decides every call, the other is skipped with one log
line, and never are both sparse on one call.
- A core sparse node applied before ours (in our `prev` chain when ours was applied; `foreign_below`): before
  every forward our DIFFUSION_MODEL wrapper puts our override back on top of that forward's transformer_options
  (`settle`), and our dense path calls what that core node wraps instead of it (`skip_foreign`).
- A core sparse node applied after ours (above ours in the chain and not in `foreign_below`): our override
  steps aside on every call (`step_aside_reason`), so the core node's own choice stands, dense or sparse.
"""
from __future__ import annotations

import types

OVERRIDE = "optimized_attention_override"
CORE_SPARSE_MODULE = "nodes_sparse_attention"  # comfy_extras.nodes_sparse_attention (ComfyUI from 2026-09)
CORE_NAME = "ComfyUI's 'Model Sparse Attention' node"
_MAX_DEPTH = 16


def is_ours(obj) -> bool:
    return bool(getattr(type(obj), "_psa_override", False))


def foreign_sparse(obj):
    """(key, wrapped override) when `obj` is the core sparse node's override closure, else None. The key is the
    identity of the node's state object (its closure variable `patch`, else the first non-callable one), the same
    for every re-install of one node."""
    if not isinstance(obj, types.FunctionType):
        return None
    if not str(getattr(obj, "__module__", "") or "").endswith(CORE_SPARSE_MODULE):
        return None
    cells = {}
    for name, cell in zip(obj.__code__.co_freevars, obj.__closure__ or ()):
        try:
            cells[name] = cell.cell_contents
        except ValueError:  # an empty cell
            pass
    if "previous" not in cells:
        return None
    state = cells.get("patch", next((c for n, c in cells.items() if n != "previous" and not callable(c)), None))
    return (id(state) if state is not None else id(obj.__code__)), cells["previous"]


def _links(obj) -> list:
    """Callables an override may call on (best effort: attributes, partial args, closure cells)."""
    inner = [getattr(obj, name, None) for name in ("prev", "previous", "__wrapped__", "func", "__self__", "orig",
                                                 "original")]
    inner.extend(getattr(obj, "args", ()) or ())
    for cell in getattr(obj, "__closure__", None) or ():
        try:
            inner.append(cell.cell_contents)
        except ValueError:
            pass
    d = getattr(obj, "__dict__", None)
    if isinstance(d, dict):
        inner.extend(d.values())
    return [x for x in inner if x is not obj and callable(x)]


def chain_contains(obj, uid: str, depth: int = 0) -> bool:
    """Best effort: does this override (or what it wraps) contain our override `uid`?"""
    if obj is None or depth > 8:
        return False
    if is_ours(obj):
        return obj.uid == uid or chain_contains(obj.prev, uid, depth + 1)
    return any(chain_contains(x, uid, depth + 1) for x in _links(obj))


def foreign_below(prev) -> frozenset:
    """Keys of the core sparse nodes in the chain under `prev` (ours wraps them: they were applied before ours)."""
    keys, cur = set(), prev
    for _ in range(_MAX_DEPTH):
        if cur is None:
            break
        fs = foreign_sparse(cur)
        if fs is not None:
            keys.add(fs[0])
            cur = fs[1]
        elif is_ours(cur):
            keys.update(getattr(cur, "foreign_below", ()))
            cur = cur.prev
        else:
            nxt = [x for x in _links(cur) if foreign_sparse(x) is not None or is_ours(x)]
            cur = nxt[0] if nxt else None
    return frozenset(keys)


def above_ours(top, uid: str):
    """(our override object in the chain or None, keys of the core sparse nodes above it), from the top down."""
    above, cur = [], top
    for _ in range(_MAX_DEPTH):
        if cur is None:
            break
        if is_ours(cur):
            if cur.uid == uid:
                return cur, above
            cur = cur.prev
            continue
        fs = foreign_sparse(cur)
        if fs is not None:
            above.append(fs[0])
            cur = fs[1]
        else:
            cur = next((x for x in _links(cur) if chain_contains(x, uid)), None)
    return None, above


def skip_foreign(prev, keys: frozenset):
    """`prev` without the core sparse nodes (of `keys`) at its top: what they wrap."""
    for _ in range(_MAX_DEPTH):
        fs = foreign_sparse(prev)
        if fs is None or fs[0] not in keys:
            break
        prev = fs[1]
    return prev


_ASIDE: dict[tuple[int, str], tuple[object, str | None]] = {}


def step_aside_reason(top, override) -> str | None:
    """Why `override` must pass this call on (a core sparse node applied after it is above it), else None.
    Decided once per (top of the chain, override), not per attention call."""
    if top is None or (is_ours(top) and top.uid == override.uid):
        return None
    key = (id(top), override.uid)
    hit = _ASIDE.get(key)
    if hit is not None and hit[0] is top:
        return hit[1]
    _, above = above_ours(top, override.uid)
    reason = None
    if any(k not in override.foreign_below for k in above):
        reason = f"{CORE_NAME} is nearer the sampler (applied after this node): it decides, this node is skipped"
    if len(_ASIDE) > 64:
        _ASIDE.clear()
    _ASIDE[key] = (top, reason)
    return reason


def ensure_installed(transformer_options: dict, override) -> bool:
    """Re-install `override` if a later node displaced it without chaining; True when it re-installed."""
    if not isinstance(transformer_options, dict):
        return False
    cur = transformer_options.get(OVERRIDE)
    if chain_contains(cur, override.uid):
        return False
    if is_ours(cur):
        return False  # another of our nodes, applied later, replaced this one on purpose
    transformer_options[OVERRIDE] = override.with_prev(cur)
    return True


def settle(transformer_options: dict, override) -> bool:
    """Put our override back on top when the core sparse nodes above it were all applied before it (they
    re-install themselves on top); True when it did."""
    if not isinstance(transformer_options, dict) or not override.foreign_below:
        return False
    top = transformer_options.get(OVERRIDE)
    ours, above = above_ours(top, override.uid)
    if ours is None or not above or any(key not in override.foreign_below for key in above):
        return False
    transformer_options[OVERRIDE] = ours
    return True

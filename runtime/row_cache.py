"""Many rows in one KV cache: each row its own tokens, its own positions, its own rejected drafts.

A forward appends the same number of columns to every row (the longest row's new tokens; a
shorter row's extra columns are padding) and each column is valid or not per row
(`valid` # [batch, columns]). Every query attends to its row's valid columns only, at its row's
own positions (the count of valid columns before it), so a row decodes as it would alone. A
rejected draft or a tree node off the accepted path is a column made invalid, not a copy; the
columns no row holds are cut from the end at once, and the cache is compacted (each row's valid
columns gathered to the right) when the holes outnumber what is kept.

When every column is valid and the new tokens are a causal block (one row, or rows in step with
no drafts rejected) the forward is the plain causal one, the very computation of decoding one
prompt alone (forward.forward_logits with no mask).

This module imports torch at import time: import it lazily.
"""

from __future__ import annotations

import torch

from specreg.errors import RuntimeConfigError
from specreg.runtime.forward import forward_logits

COMPACT_SLACK = 16  # columns of holes tolerated beyond the kept ones before compacting


class RowCache:
    """A transformers DynamicCache of `batch` rows with a validity mask per column."""

    def __init__(self, config, batch: int, device):
        from transformers import DynamicCache

        self.cache = DynamicCache(config=config)
        self.valid = torch.zeros(batch, 0, dtype=torch.bool, device=device)  # [b, columns]
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)  # [b] valid columns: each row's next position

    def forward(self, model, input_ids, query_valid, offsets, new_mask=None, logits_to_keep: int = 1,
                hidden_state_ids: tuple[int, ...] = ()):
        """One forward of every row's new tokens.

        input_ids    # [b, q]     the new tokens, padding where query_valid is False
        query_valid  # [b, q]     bool: real tokens (padding is never seen by any other query)
        offsets      # [b, q]     each token's position after the row's cached tokens (0 = the next one)
        new_mask     # [q, q]     bool: which new tokens each new token sees (a candidate tree); None: causal
        -> logits # [b, logits_to_keep, vocab] of the last columns (and hidden # [b, q, A * H] with
        hidden_state_ids, as forward_logits). Call keep() after it."""
        plain = new_mask is None and bool(self.valid.all()) and bool(query_valid.all())
        if plain:
            return forward_logits(model, input_ids, self.cache, logits_to_keep, hidden_state_ids)
        mask, position_ids = self.attention(query_valid, offsets, new_mask, next(model.parameters()).dtype)
        return forward_logits(model, input_ids, self.cache, logits_to_keep, hidden_state_ids,
                              attention_mask=mask, position_ids=position_ids)

    def attention(self, query_valid, offsets, new_mask=None, dtype=None, sees_columns=None):
        """What a forward of new queries over this cache attends with -> (attention_mask # [b, 1, q,
        columns + q] additive in dtype, position_ids # [b, q]): each query sees its row's valid
        columns (or sees_columns # [b, q, columns] bool when given) and the new tokens new_mask
        # [q, q] or [b, q, q] lets it see (None: causal), at its row's own positions (lengths + offsets)."""
        odd = next((type(layer).__name__ for layer in self.cache.layers if type(layer).__name__ != "DynamicLayer"), None)
        if odd is not None:
            # a sliding-window layer keeps only its window: column masks over it would be wrong
            raise RuntimeConfigError(f"decoding rows of different lengths or with candidate trees needs "
                                     f"full-attention dynamic cache layers, not {odd}: decode one prompt at a "
                                     f"time (validate --runtime-batch 1), with chains")
        batch, queries = query_valid.shape
        device = query_valid.device
        sees_new = torch.ones(queries, queries, dtype=torch.bool, device=device).tril() if new_mask is None else new_mask
        # a query always sees itself, so a padding query has one key and no row of the softmax is empty
        sees_new = sees_new if sees_new.dim() == 3 else sees_new[None]
        sees_new = (sees_new & query_valid[:, None, :]) | torch.eye(queries, dtype=torch.bool, device=device)
        if sees_columns is None:
            sees_columns = self.valid[:, None, :].expand(batch, queries, -1)
        sees = torch.cat([sees_columns, sees_new], dim=2)  # [b, q, columns + q]
        dtype = dtype or torch.float32
        mask = torch.zeros(sees.shape, dtype=dtype, device=device).masked_fill(~sees, torch.finfo(dtype).min)
        return mask.unsqueeze(1), self.lengths[:, None] + offsets

    def keep(self, kept) -> None:
        """kept # [b, q] bool: which of the last forward's columns stay in each row."""
        self.valid = torch.cat([self.valid, kept], dim=1)
        self.lengths = self.lengths + kept.sum(dim=1)
        self.trim()

    def truncate(self, lengths: list[int]) -> None:
        """Keep each row's first lengths[r] valid columns (drop drafts the target rejected)."""
        limit = torch.as_tensor(lengths, dtype=torch.long, device=self.valid.device)  # [b]
        self.valid = self.valid & (self.valid.cumsum(dim=1) <= limit[:, None])
        self.lengths = torch.minimum(self.lengths, limit)
        self.trim()

    def select(self, rows: list[int]) -> None:
        """Keep only these rows (the others finished)."""
        index = torch.as_tensor(rows, dtype=torch.long, device=self.valid.device)
        self.cache.batch_select_indices(index)
        self.valid, self.lengths = self.valid[index], self.lengths[index]
        self.trim()

    def extend(self, other: "RowCache") -> None:
        """Append other's rows after these (rows admitted while these decode). Keys hold their
        rotary positions already, so a column's place does not matter: the narrower cache is
        padded with invalid columns on the left to the other's width. A side that never ran a
        forward (a drafter that has not drafted yet) joins as rows of invalid columns."""
        columns = max(self.valid.shape[1], other.valid.shape[1])
        counts = (self.valid.shape[0], other.valid.shape[0])
        for layer, added in zip(self.cache.layers, other.cache.layers):
            sides = (layer, added)
            known = next((side for side in sides if side.is_initialized), None)
            if known is None:
                continue
            if not layer.is_initialized:
                layer.lazy_initialization(known.keys, known.values)
            for name in ("keys", "values"):
                parts = [left_pad(getattr(side, name) if side.is_initialized
                                  else empty_like(getattr(known, name), rows), columns)
                         for side, rows in zip(sides, counts)]
                setattr(layer, name, torch.cat(parts, dim=0))
        self.valid = torch.cat([left_pad(self.valid, columns, dim=1), left_pad(other.valid, columns, dim=1)], dim=0)
        self.lengths = torch.cat([self.lengths, other.lengths])

    def trim(self) -> None:
        held = self.valid.any(dim=0)  # [columns]
        columns = held.shape[0]
        tail = columns - (int(held.nonzero().max()) + 1 if bool(held.any()) else 0)
        if tail:
            self.cache.crop(-tail)
            self.valid = self.valid[:, :columns - tail]
        if self.valid.shape[1] > int(self.lengths.max()) * 2 + COMPACT_SLACK:
            self.compact()

    def compact(self) -> None:
        """Gather each row's valid columns to the right end of a cache as wide as the longest row."""
        width = int(self.lengths.max())
        columns = self.valid.shape[1]
        # sort each row's columns invalid first, keeping order: the valid ones end up at the right
        # (the key is a long: valid * columns overflows a small integer type past 127 columns)
        order = torch.argsort(self.valid.long() * columns + torch.arange(columns, device=self.valid.device),
                              dim=1)[:, columns - width:]  # [b, width]
        for layer in self.cache.layers:
            if layer.keys is None or layer.keys.numel() == 0:
                continue
            # each by its own shape: an MLA layer's keys (nope + rope) and values (v_head_dim) differ in width
            for name in ("keys", "values"):
                entries = getattr(layer, name)
                setattr(layer, name, entries.gather(2, order[:, None, :, None].expand(-1, entries.shape[1], -1,
                                                                                      entries.shape[-1])))
        self.valid = self.valid.gather(1, order)


def joined(first: "RowCache | None", second: "RowCache | None", config, first_rows: int,
           second_rows: int) -> "RowCache | None":
    """Two drafters' caches as one, second's rows after first's (RowCache.extend); a side that never
    ran a forward has none and joins as rows of no columns; None when neither has one."""
    if first is None and second is None:
        return None
    device = (first or second).valid.device
    first = first or RowCache(config, first_rows, device)
    first.extend(second or RowCache(config, second_rows, device))
    return first


def left_pad(tensor, columns: int, dim: int = 2):
    """tensor widened to `columns` along dim with zeros (False: invalid columns) on the left."""
    missing = columns - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([torch.zeros(shape, dtype=tensor.dtype, device=tensor.device), tensor], dim=dim)


def empty_like(tensor, rows: int):
    """No columns of `rows` rows shaped like tensor # [b, heads, columns, dim] -> [rows, heads, 0, dim]."""
    return tensor.new_zeros(rows, tensor.shape[1], 0, tensor.shape[3])

"""Pictures for the exercises: the flattened batch that exercise 3's paged_attention receives.

`example_metadata` builds the AttentionMetadata of a small made-up step (the model runner builds
the real one each step); `plot_flattened_batch` draws it three ways: the step's tokens as one
flat run of rows cut by query_start_loc, each request's context of seq_lens tokens (cached, then
new) cut into blocks, and where those blocks sit in the paged cache (the block tables).
Nothing here is measured: the figure explains data layout, not speed.
"""

from __future__ import annotations

import torch

from nanoserve.kernels import AttentionMetadata

EXAMPLE_STEP = ((1, 5), (3, 4), (2, 0))  # (new tokens, cached tokens): a decode, a chunk, a prompt
# The figure is FIG_WIDTH inches wide, so a notebook shows it about full size, not shrunk to fit,
# and its smallest labels, LABEL_PT, still read at 8 points or more.
FIG_WIDTH, LABEL_PT = 9.0, 9


def example_metadata(seqs=EXAMPLE_STEP, block_size: int = 4, num_blocks: int = 12,
                     seed: int = 1) -> AttentionMetadata:
    """AttentionMetadata of a step whose requests have seqs = [(q_len, cached_len), ...];
    each request gets distinct blocks in a shuffled order, as a long-running engine hands them out."""
    seqs = [(int(q), int(c)) for q, c in seqs]
    if not seqs or any(q < 1 or c < 0 for q, c in seqs):
        raise ValueError(f"seqs={seqs!r}: each request needs q_len >= 1 and cached_len >= 0")
    lens = [q + c for q, c in seqs]
    width = max(-(-n // block_size) for n in lens)
    if len(seqs) * width > num_blocks:
        raise ValueError(f"num_blocks={num_blocks}: the example needs {len(seqs) * width} blocks")
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed))
    tables = perm[:len(seqs) * width].view(len(seqs), width).to(torch.int32)  # (B, max_blocks)
    qsl = torch.tensor([0, *torch.tensor([q for q, _ in seqs]).cumsum(0).tolist()], dtype=torch.int32)
    return AttentionMetadata(qsl, torch.tensor(lens, dtype=torch.int32), tables,
                             query_start_loc_cpu=qsl.tolist(), seq_lens_cpu=lens)


def _cell(ax, x, y, color, text, alpha=1.0):
    """One token: a coloured unit square at (x, y) with its position written in it."""
    from matplotlib.patches import Rectangle
    ax.add_patch(Rectangle((x, y), 1, 0.8, facecolor=color, alpha=alpha, edgecolor="white"))
    ax.text(x + 0.5, y + 0.4, text, ha="center", va="center", fontsize=LABEL_PT)


def plot_flattened_batch(attn: AttentionMetadata | None = None, block_size: int = 4,
                         num_blocks: int | None = None):
    """Draw a step's AttentionMetadata (default: example_metadata()). Colour = request; a cell's
    number is the token's position in its request; faded cells were cached before this step.
    -> the Figure (three panels: q rows, contexts, the paged cache)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle
    attn = example_metadata(block_size=block_size) if attn is None else attn
    qsl, lens = attn.host_offsets()
    tables = attn.block_tables.tolist()
    num_blocks = num_blocks or max(max(t) for t in tables) + 1
    colors = [plt.get_cmap("tab10")(b % 10) for b in range(len(lens))]
    fig, (top, mid, low) = plt.subplots(3, 1, figsize=(FIG_WIDTH, 6.8), constrained_layout=True,
                                        gridspec_kw=dict(height_ratios=[1, len(lens), 1.2]))

    for b, seq_len in enumerate(lens):  # q: the step's tokens, one flat run cut by query_start_loc
        q_len = qsl[b + 1] - qsl[b]
        for j in range(q_len):
            _cell(top, qsl[b] + j, 0, colors[b], f"p{seq_len - q_len + j}")
        top.text((qsl[b] + qsl[b + 1]) / 2, 0.9, f"request {b}", ha="center", fontsize=LABEL_PT)
    top.set_xticks(qsl, [str(x) for x in qsl])
    top.set(xlim=(-0.2, qsl[-1] + 0.2), ylim=(-0.1, 1.2), yticks=[],
            xlabel="row of q (ticks: query_start_loc; p = the token's position in its request)",
            title=f"q: {qsl[-1]} rows, the step's new tokens of {len(lens)} requests; "
                  f"query_start_loc = {qsl}")

    for b, seq_len in enumerate(lens):  # each request's context: cached, then this step's tokens
        q_len, y = qsl[b + 1] - qsl[b], len(lens) - 1 - b
        for p in range(seq_len):
            _cell(mid, p, y, colors[b], str(p), alpha=1.0 if p >= seq_len - q_len else 0.35)
        for i in range(-(-seq_len // block_size)):
            mid.text(i * block_size, y + 0.9, f"block {tables[b][i]}", fontsize=LABEL_PT)
            mid.axvline(i * block_size, ymin=0, ymax=1, color="grey", lw=0.5)
    width = max(lens)
    mid.set(xlim=(-0.2, -(-width // block_size) * block_size + 0.2), ylim=(-0.1, len(lens) + 0.2),
            yticks=[len(lens) - 0.6 - b for b in range(len(lens))],
            yticklabels=[f"request {b}\nseq_len {n}" for b, n in enumerate(lens)],
            xlabel="position in the request (faded: cached before this step)",
            title=f"contexts: seq_lens = {lens}; block tables (the used part) = "
                  f"{[t[:-(-n // block_size)] for t, n in zip(tables, lens)]}")

    for blk in range(num_blocks):  # the paged cache: which request's positions each block holds
        low.add_patch(Rectangle((blk * block_size, 0), block_size, 0.8, fill=False, edgecolor="grey"))
        low.text(blk * block_size + block_size / 2, 0.95, f"block {blk}", ha="center", fontsize=LABEL_PT)
    for b, seq_len in enumerate(lens):
        for p in range(seq_len):
            blk = tables[b][p // block_size]
            _cell(low, blk * block_size + p % block_size, 0, colors[b], str(p),
                  alpha=1.0 if p >= seq_len - (qsl[b + 1] - qsl[b]) else 0.35)
    low.set(xlim=(-0.2, num_blocks * block_size + 0.2), ylim=(-0.1, 1.2), yticks=[],
            xlabel=f"slot = block * {block_size} + offset",
            title=f"the paged cache: {num_blocks} blocks of {block_size} slots (k_cache and v_cache alike)")
    for ax in (top, mid, low):
        ax.spines[["top", "right", "left"]].set_visible(False)
        ax.title.set_fontsize(10)
        ax.xaxis.label.set_fontsize(LABEL_PT)
        ax.tick_params(labelsize=LABEL_PT)
    return fig

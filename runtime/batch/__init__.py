"""`personaplex-edge batch`: many recordings answered offline, unpaced and in lockstep,
resumable and sharded; and `decode`, its second stage (codes -> audio).

What this room may import: the runtime's public API and what stands under it - never torch.

    items         what a run answers: a Full-Duplex-Bench tree, a folder, a JSONL manifest;
                  --shard K/N
    runner        the run: items on the rows of lockstep batches, outputs written atomically,
                  the summary
    agent_codes   the codes file of --codes, and its decoding back to audio
    progress      the bar on a terminal, plain lines in a log
"""

from .agent_codes import AgentCodes
from .items import Item, find_items, parse_shard, shard
from .progress import BatchProgress
from .runner import BatchSummary, run_batch

__all__ = ["AgentCodes", "BatchProgress", "BatchSummary", "Item", "find_items", "parse_shard",
           "run_batch", "shard"]

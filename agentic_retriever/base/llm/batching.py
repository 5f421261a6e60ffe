"""Planning of prefill batches over token rows, pure functions of token ids and lengths: the order rows
are cut into batches (`batch_order`, prefix-aware), the runs of a batch that share one prefix computed once
(`prefix_groups`), and the split of rows into left-padded passes of (nearly) equal length (`length_groups`).
"""

from __future__ import annotations

from collections.abc import Sequence


def shared_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences of one type (both lists or both tuples;
    slice comparisons: C speed, log steps)."""
    length = min(len(a), len(b))
    if a[:length] == b[:length]:
        return length
    low, high = 0, length  # a[:low] == b[:low], a[:high] != b[:high]
    while high - low > 1:
        middle = (low + high) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle
    return low


def common_prefix_length(rows: Sequence[Sequence[int]]) -> int:
    """Length of the longest token prefix that all rows share."""
    first, length = list(rows[0]), min(len(row) for row in rows)
    for row in rows[1:]:
        length = min(length, shared_length(first, list(row)))
    return length


def batch_order(rows: Sequence[list[int]], reuse_prefix: bool) -> list[int]:
    """The order in which rows are cut into batches.

    Without prefix reuse: by length (least padding). With it: by the token ids themselves, which puts rows
    that share a prefix next to each other (all continuations of one agent context, whatever their order in
    the call); neighbours sharing at least half of the shorter row form a family, and families go by their
    longest row, so a batch does not mix a short prompt with a long unrelated one (padding).
    """
    if not reuse_prefix:
        return sorted(range(len(rows)), key=lambda r: len(rows[r]))
    lexical = sorted(range(len(rows)), key=rows.__getitem__)
    families: list[list[int]] = []
    for r in lexical:
        if families:
            last = rows[families[-1][-1]]
            if 2 * shared_length(last, rows[r]) >= min(len(last), len(rows[r])):
                families[-1].append(r)
                continue
        families.append([r])
    families.sort(key=lambda family: max(len(rows[r]) for r in family))  # stable: ties keep token order
    return [r for family in families for r in family]


def prefix_groups(rows: Sequence[list[int]], limits: Sequence[int]) -> list[tuple[int, int, int]]:
    """Split a batch of rows (sorted by token ids) into runs that each compute one shared prefix once.

    Returns (start, end, prefix length) per run, covering the rows in order. A run's prefix is the token
    prefix its rows share, at most each row's `limits` entry; a run of one row gets its `limits` entry (its
    prompt goes through the prefix pass). The split minimises the tokens computed, counting a run's rows
    as padded to its longest suffix: sum over runs of prefix + rows x (longest row - prefix), by dynamic
    programming over the run ends (ties go to fewer runs). So the continuations of one context form one
    run, and a row whose own context is much longer is not pooled at the shorter context they share.
    """
    n = len(rows)
    neighbours = [shared_length(rows[i], rows[i + 1]) for i in range(n - 1)]
    cost = [0] * (n + 1)  # cost[j]: the fewest tokens computed for the first j rows
    start = [0] * (n + 1)
    for j in range(1, n + 1):
        prefix, longest = max(limits[j - 1], 0), len(rows[j - 1])
        cost[j], start[j] = cost[j - 1] + prefix + (longest - prefix), j - 1
        for i in range(j - 2, -1, -1):  # the run i .. j-1
            prefix = min(prefix, neighbours[i], limits[i])
            if prefix <= 0:
                break
            longest = max(longest, len(rows[i]))
            total = cost[i] + prefix + (j - i) * (longest - prefix)
            if total <= cost[j]:
                cost[j], start[j] = total, i
    runs = []
    j = n
    while j > 0:
        i = start[j]
        prefix = min(limits[i:j]) if j - i == 1 else min(min(limits[i:j]), min(neighbours[i:j - 1]))
        runs.append((i, j, max(prefix, 0)))
        j = i
    return runs[::-1]


def length_groups(lengths: Sequence[int], pass_cost: int) -> list[list[int]]:
    """Split items (token lists of these lengths) into groups, each one left-padded forward pass.

    A pass is counted as its token slots (its longest length times its size: padding included) plus
    `pass_cost` tokens, what a pass costs beyond its tokens; the split minimises the total, by dynamic
    programming over the items sorted by length. So items of (nearly) equal length share a pass, and an item
    whose padding in a pass would cost more than a pass of its own gets one. Returns the groups, shortest
    first, each's items in ascending index order.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    cost = [0] * (len(order) + 1)  # cost[j]: the least cost of the j shortest items
    start = [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        longest = lengths[order[j - 1]]
        cost[j], start[j] = min((cost[i] + (j - i) * longest + pass_cost, i) for i in range(j))
    groups = []
    j = len(order)
    while j > 0:
        groups.append(sorted(order[start[j]:j]))
        j = start[j]
    return groups[::-1]

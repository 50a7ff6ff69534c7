"""The storage server's chunk writes: an upload's chunks land on its threads in any order."""
from __future__ import annotations

import os
import random
import threading

from actors.storage import write_at


def test_chunks_written_at_once_in_any_order_make_the_whole_file(tmp_path):
    chunk, count = 4096, 64
    for trial in range(20):
        data = os.urandom(chunk * count - 123)  # a short tail chunk
        part = tmp_path / f"shard-{trial}.part"
        offsets = list(range(0, len(data), chunk))
        random.Random(trial).shuffle(offsets)
        start = threading.Barrier(len(offsets))

        def put(offset: int) -> None:
            start.wait()  # every chunk at once, as the server's threads take them
            write_at(part, offset, data[offset:offset + chunk])

        threads = [threading.Thread(target=put, args=(o,)) for o in offsets]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert part.read_bytes() == data, f"trial {trial}: a chunk was lost"

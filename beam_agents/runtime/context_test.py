"""The agent contract's process-wide parts (context): calls to one model are capped per worker."""

from __future__ import annotations


def test_calls_to_one_model_are_capped_per_worker():
    import threading
    import time

    from beam_agents.runtime.context import model_slot

    running, peak, lock = [0], [0], threading.Lock()

    def call():
        with model_slot("capped-model", 2):
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            time.sleep(0.02)
            with lock:
                running[0] -= 1

    threads = [threading.Thread(target=call) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert peak[0] == 2

"""``await kickmsg.aio.board_change(...)``: a Blackboard change awaited in
asyncio, woken by a native kickmsg 0.9.2 writer (a subprocess,
tests/nativepeer.py). Boards live under the test's ``prefix`` namespace and
are removed whatever the outcome.
"""
import asyncio

from kickmsg import Blackboard, BlackboardConfig, aio
from nativepeer import start_native9

NATIVE_WRITER = r'''
b = kickmsg.Blackboard.open_or_create(P["ns"], "state", kickmsg.BlackboardConfig(), "nat")
w = b.declare("mode")
ready()
wait_go()
w.write(b"docking")
done(0)
'''


def test_a_native_write_wakes_an_awaiting_task(prefix):
    with start_native9(NATIVE_WRITER, ns=prefix) as child:
        child.wait_ready()
        board = Blackboard.try_open(prefix, "state")

        async def main():
            seen = board.change_seq
            waiting = asyncio.create_task(aio.board_change(board, seen, 20))
            child.tell()  # the write may come before or after the task sleeps: either way it returns True
            return await waiting

        assert asyncio.run(main()) is True
        child.result()
        assert board.observe("mode").read().data == b"docking"


def test_no_change_is_false_at_timeout_and_a_past_change_true_at_once(prefix):
    board = Blackboard.open_or_create(prefix, "state", BlackboardConfig(), "py")
    seen = board.change_seq

    async def main():
        quiet = await aio.board_change(board, seen, 0.05)
        board.declare("k").write(b"v")
        return quiet, await aio.board_change(board, seen, 0)

    assert asyncio.run(main()) == (False, True)

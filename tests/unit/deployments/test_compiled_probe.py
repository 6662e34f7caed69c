"""After `make run` moves a chat deployment onto compiled replicas it waits, in a process of
its own, until the deployment answers with compiled engines (serve_app/compiled_probe.py):
an eager replica's answer, or one that fails while a replica stops, means ask again."""

from __future__ import annotations

from serve_app.compiled_probe import all_compiled, wait_compiled

EAGER = {"smollm2-135m-instruct": {"unfinished": 0, "compiled": False}}
COMPILED = {"smollm2-135m-instruct": {"unfinished": 0, "compiled": True}}


def test_a_deployment_counts_as_compiled_when_every_engine_says_so():
    assert all_compiled(COMPILED)
    assert not all_compiled(EAGER)
    assert not all_compiled({**COMPILED, "other": {"compiled": False}})
    assert all_compiled({**COMPILED, "remote": {"unfinished": 0}})  # a server elsewhere
    assert not all_compiled({}) and not all_compiled(None)


def test_the_wait_asks_again_until_the_compiled_replica_answers():
    answers = iter([EAGER, RuntimeError("replica stopping"), EAGER, COMPILED])
    asked: list[str] = []

    def ask(name: str) -> dict:
        asked.append(name)
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert wait_compiled(ask, ["text-xs"], timeout_s=60, pause_s=0) == set()
    assert asked == ["text-xs"] * 4


def test_the_wait_names_what_did_not_compile_by_the_deadline():
    assert wait_compiled(lambda name: EAGER, ["text-xs"], timeout_s=0.01, pause_s=0) == {
        "text-xs"}

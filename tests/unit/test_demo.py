"""``phalanx demo``'s scenarios, in process, on ephemeral ports: every story and LWS group lands
whole (the quorum database one replica a node), the too-big gang waits with the solver's reason —
which ``phalanx explain`` reads from the demo's gRPC port — and the urgent gang preempts the
``disruptionMode: all`` shards as one unit, which are then placed again elsewhere."""

import io

import pytest

from phalanx_cli.demo import Demo
from phalanx_cli.main import main


def test_the_demo_scenarios_place_explain_and_preempt(capsys):
    out = io.StringIO()
    demo = Demo(port=0, out=out, grpc_port=0)
    demo.start()
    try:
        demo.run_scenarios()
        states = {key: demo.state(key) for key in demo.cycle.cache.podgroups}
        database = {r.pod.node for r in demo.cycle.cache.members("demo/cockroach")}
        assert main(["explain", "demo/too-big", "--grpc-addr", f"127.0.0.1:{demo.phalanx.grpc.port}"]) == 0
    finally:
        demo.close()
    explained = capsys.readouterr().out
    assert explained.startswith("podgroup demo/too-big: unschedulable\n") and "needs 160 nvidia.com/gpu" in explained
    assert len(database) == 5  # never two replicas of the quorum on one node
    text = out.getvalue()
    assert states.pop("demo/too-big") == "unschedulable"
    assert set(states.values()) == {"scheduled"}, states
    assert "needs 160 nvidia.com/gpu, 128 free" in text
    assert "demo/urgent preempted 8 pods as whole units: podgroup demo/shards (8 pods)" in text
    assert demo.rack_of("demo/urgent") != demo.rack_of("demo/shards")


def test_a_demo_port_in_use_is_one_line(capsys):
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        with pytest.raises(SystemExit) as exit_:
            main(["demo", "--port", str(taken.getsockname()[1]), "--grpc-port", "0", "--headless", "--duration", "1"])
    finally:
        taken.close()
    message = str(exit_.value)
    assert message.startswith("phalanx demo: ") and "in use" in message and "--port" in message
    assert "\n" not in message and "Traceback" not in capsys.readouterr().err

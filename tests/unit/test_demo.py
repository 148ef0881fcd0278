"""``phalanx demo``'s scenarios, in process, on an ephemeral port: every story and LWS group lands
whole, the too-big gang waits with the solver's reason, and the urgent gang preempts the
``disruptionMode: all`` shards as one unit, which are then placed again elsewhere."""

import io

from phalanx_cli.demo import Demo


def test_the_demo_scenarios_place_explain_and_preempt():
    out = io.StringIO()
    demo = Demo(port=0, out=out)
    demo.start()
    try:
        demo.run_scenarios()
        states = {key: demo.state(key) for key in demo.cycle.cache.podgroups}
    finally:
        demo.close()
    text = out.getvalue()
    assert states.pop("demo/too-big") == "unschedulable"
    assert set(states.values()) == {"scheduled"}, states
    assert "needs 160 nvidia.com/gpu, 128 free" in text
    assert "demo/urgent preempted 8 pods as whole units: podgroup demo/shards (8 pods)" in text
    assert demo.rack_of("demo/urgent") != demo.rack_of("demo/shards")

"""loadtest/profile_native.py's py-spy owners, on stacks in py-spy's raw format as it writes
them for an agent (frames outermost first; `--native` interleaves C frames)."""

from loadtest.profile_native import owner, spy_shares

ADMIT = "Admission._admit (echelon/agent/admission.py:190)"
RUN = "Runner.run (asyncio/runners.py:118)"


def test_each_sample_goes_to_the_innermost_frame_that_is_not_the_interpreter():
    assert owner([RUN, ADMIT, "fill (<schema>:6)", "_PyObject_Malloc (libpython3.11.so.1.0)"]) == \
        "echelon agent/admission:Admission._admit"  # the interpreter running our function: ours
    assert owner([RUN, ADMIT, "fill (<schema>:14)", "PyUpb_MapContainer_Subscript (_message.abi3.so)",
                  "upb_Map_New (_message.abi3.so)", "malloc (libc.so.6)"]) == "protobuf"
    assert owner([RUN, "0x7f40 (grpc/_cython/cygrpc.cpython-311-x86_64-linux-gnu.so)", "sendmsg (libc.so.6)"]) == "grpc"
    assert owner([RUN, "_StreamRequestMixin._write (grpc/aio/_call.py:500)", "write (libc.so.6)"]) == "grpc"
    assert owner([RUN, ADMIT, "fill (<schema>:2)", "gc_collect_main (libpython3.11.so.1.0)",
                  "visit_reachable (libpython3.11.so.1.0)"]) == "gc"
    assert owner(["Thread.run (threading.py:982)", "epoll_wait (libc.so.6)"]) == "waiting"
    assert owner(["_PollLikeSelector.select (selectors.py:415)", "poll (libc.so.6)"]) == "waiting"
    assert owner([RUN]) == "native under the loop or a thread"  # --nonblocking: no native frames
    assert owner([RUN, "BaseEventLoop._run_once (asyncio/base_events.py:1922)"]) == "asyncio"


def test_shares_leave_the_waits_out(tmp_path):
    raw = tmp_path / "agent-0.raw"
    raw.write_text(f"{RUN};{ADMIT} 30\n"
                   f"{RUN};{ADMIT};fill (<schema>:9);PyUpb_Message_WhichOneof (_message.abi3.so) 10\n"
                   f"Thread.run (threading.py:982);epoll_wait (libc.so.6) 60\n")
    shares = spy_shares(raw, 5)
    assert shares["samples"] == 40 and shares["waiting"] == 60
    assert dict(shares["groups"]) == {"echelon (all)": 75.0, "protobuf": 25.0}
    assert shares["echelon"] == [("echelon agent/admission:Admission._admit", 75.0)]

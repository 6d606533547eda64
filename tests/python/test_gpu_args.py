"""put() and GPU producers, without a GPU: what tensord asks of a DLPack
producer before it copies. The producers here are fakes that record the
keywords their __dlpack__ received; a GPU one stops put() right there (by
raising), before anything would touch a driver.

DLPack says the consumer passes the stream it will use, and the producer
makes that stream wait for its queued work. put() copies a CUDA source on
the legacy default stream (DLPack stream 1) and a ROCm source on the null
stream (0), then waits for that stream; a host source gets stream=None.
"""
import numpy as np
import pytest


class Stop(Exception):
    """Raised by a fake GPU producer once it has recorded its call."""


class FakeProducer:
    def __init__(self, device, backing=None):
        self.device = device
        self.backing = backing
        self.calls = []

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self.calls.append({"stream": stream, "max_version": max_version})
        if self.backing is None:
            raise Stop()
        return self.backing.__dlpack__(stream=stream, max_version=max_version)


class OldProducer(FakeProducer):
    """A producer from before DLPack 1.0: no max_version keyword."""

    def __dlpack__(self, stream=None):
        self.calls.append({"stream": stream})
        raise Stop()


@pytest.mark.parametrize("device,stream", [((2, 0), 1), ((2, 3), 1), ((10, 0), 0)],
                         ids=["cuda:0", "cuda:3", "rocm:0"])
def test_put_passes_the_copy_stream(client, device, stream):
    p = FakeProducer(device)
    with pytest.raises(Stop):
        client.put("gpu/args", p)
    assert len(p.calls) == 1
    assert p.calls[0]["stream"] == stream
    assert type(p.calls[0]["stream"]) is int
    assert p.calls[0]["max_version"][0] == 1
    # Nothing was created: the producer failed before any request.
    with pytest.raises(FileNotFoundError):
        client.stat("gpu/args")


def test_put_old_gpu_producer_still_gets_the_stream(client):
    p = OldProducer((2, 0))
    with pytest.raises(Stop):
        client.put("gpu/old", p)
    # First try had max_version (TypeError), the second only the stream.
    assert p.calls == [{"stream": 1}]


def test_put_host_producer_gets_no_stream(client):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    p = FakeProducer((1, 0), backing=a)
    client.put("host/args", p)
    assert len(p.calls) == 1
    assert p.calls[0]["stream"] is None
    assert p.calls[0]["max_version"] is not None
    with client.attach("host/args") as t:
        assert np.array_equal(np.from_dlpack(t), a)


def test_put_refuses_other_devices_without_asking(client):
    p = FakeProducer((4, 0))  # kDLOpenCL
    with pytest.raises(BufferError, match="device type 4"):
        client.put("gpu/ocl", p)
    assert p.calls == []

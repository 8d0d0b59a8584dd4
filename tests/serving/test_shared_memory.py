"""System shared memory (Triton's extension) as clients see it: a real `mmc-serve` with
MMC_SHM=on, driven by `tritonclient.http` and `tritonclient.grpc` unchanged, with the regions
made by `tritonclient.utils.shared_memory`: register, infer with inputs and outputs in shared
memory, status, unregister; every bad call refused with its code and a message that names what
is wrong; mappings released on unregister. Off by default, and CUDA shared memory not offered."""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
import tritonclient.utils.shared_memory as shm
from onnx import TensorProto, helper
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import (
    InferenceServerException,
    serialize_byte_tensor,
    serialized_byte_size,
)

from registry import samples
from serving.core.dataplane import DataPlane
from serving.core.gpu import gpu_available
from serving.core.shared_memory import SharedMemoryRegistry
from serving.edge_limits import EdgeLimits
from serving.http.app import ServingApp, ServingSettings
from tests.serving.test_app import Server, serve_command, write_model

MAX_REGIONS = 4
MAX_BYTES = 64 * 1024
X = np.linspace(-1, 1, 2 * 64, dtype=np.float32).reshape(2, 64)


def pair() -> bytes:
    """sum = a + b and diff = a - b on [batch, 4]: two inputs, two outputs."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["sum"]), helper.make_node("Sub", ["a", "b"],
                                                                        ["diff"])], "pair",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 4]) for n in "ab"],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 4])
         for n in ("sum", "diff")])
    return helper.make_model(graph, ir_version=samples.IR_VERSION, opset_imports=[
        helper.make_opsetid("", samples.OPSET)]).SerializeToString()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("shm-repo") / "models"
    write_model(root, "mlp", "1", samples.mlp(seed=0), {"max_batch_size": 8})
    write_model(root, "pair", "1", pair())
    write_model(root, "text", "1", samples.identity(TensorProto.STRING, ["batch", 2]))
    srv = Server(root, grpc=True, MMC_SHM="on", MMC_SHM_MAX_REGIONS=str(MAX_REGIONS),
                 MMC_SHM_MAX_BYTES=str(MAX_BYTES))  # --workers auto: one, for shared memory
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


class Front:
    """One client library against the server, and how it spells a refusal."""

    def __init__(self, kind: str, server: Server) -> None:
        self.kind = kind
        self.lib = thttp if kind == "http" else tgrpc
        self.client = (thttp.InferenceServerClient(server.url[len("http://"):]) if kind == "http"
                       else tgrpc.InferenceServerClient(server.grpc_address))
        self.bad = "400" if kind == "http" else "StatusCode.INVALID_ARGUMENT"

    def regions(self) -> dict[str, dict]:
        """name -> {key, offset, byte_size}, from either client's status answer."""
        if self.kind == "http":
            answer = self.client.get_system_shared_memory_status()
            return {r["name"]: {k: r[k] for k in ("key", "offset", "byte_size")}
                    for r in answer}
        answer = self.client.get_system_shared_memory_status(as_json=True)
        return {name: {"key": r["key"], "offset": int(r.get("offset", 0)),
                       "byte_size": int(r["byte_size"])}
                for name, r in answer.get("regions", {}).items()}

    def shape_of(self, result, name: str) -> list[int]:
        output = result.get_output(name)
        return list(output["shape"]) if self.kind == "http" else list(output.shape)


@pytest.fixture(scope="module", params=["http", "grpc"])
def front(request, server):
    f = Front(request.param, server)
    yield f
    f.client.close()


_COUNTER = itertools.count()


@pytest.fixture
def objects(front):
    """Makes client-side shared-memory objects (unique keys); at the end every region is
    unregistered from the server and every object destroyed."""
    made = []

    def make(size: int, values: list[np.ndarray] | None = None):
        tag = f"mmc-spec-{os.getpid()}-{next(_COUNTER)}"
        handle = shm.create_shared_memory_region(tag, "/" + tag, size, create_only=True)
        made.append(handle)
        if values:
            shm.set_shared_memory_region(handle, values)
        return tag, "/" + tag, handle

    yield make
    front.client.unregister_system_shared_memory()
    for handle in made:
        shm.destroy_shared_memory_region(handle)


def refused(call, *args, **kwargs) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as info:
        call(*args, **kwargs)
    return info.value.status(), info.value.message()


def mlp_reference(front) -> np.ndarray:
    x = front.lib.InferInput("x", list(X.shape), "FP32")
    x.set_data_from_numpy(X)
    return front.client.infer("mlp", [x]).as_numpy("y")


def mapped(server: Server, key: str) -> list[str]:
    """What the server process holds of object `key`: mapping lines and open descriptors."""
    path = f"/dev/shm/{key[1:]}"
    pid = server.proc.pid
    lines = [line for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
             if path in line]
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(path):
                lines.append(f"fd {fd}")
        except OSError:
            pass
    return lines


# -- the round trip ------------------------------------------------------------------------------


def test_a_client_registers_infers_through_shared_memory_reads_status_and_unregisters(
        server, front, objects):
    meta = front.client.get_server_metadata()
    extensions = meta["extensions"] if front.kind == "http" else list(meta.extensions)
    assert "system_shared_memory" in extensions
    in_name, in_key, in_handle = objects(X.nbytes, [X])
    out_name, out_key, out_handle = objects(2 * 10 * 4)
    front.client.register_system_shared_memory(in_name, in_key, X.nbytes)
    front.client.register_system_shared_memory(out_name, out_key, 2 * 10 * 4)
    assert front.regions() == {
        in_name: {"key": in_key, "offset": 0, "byte_size": X.nbytes},
        out_name: {"key": out_key, "offset": 0, "byte_size": 80}}
    x = front.lib.InferInput("x", [2, 64], "FP32")
    x.set_shared_memory(in_name, X.nbytes)
    y = front.lib.InferRequestedOutput("y")
    y.set_shared_memory(out_name, 80)
    result = front.client.infer("mlp", [x], outputs=[y])
    answered = result.get_output("y")
    if front.kind == "http":  # named, with no data in the answer
        assert "data" not in answered and "binary_data_size" not in answered.get(
            "parameters", {})
    else:
        assert list(result.get_response().raw_output_contents) == [b""]
    assert front.shape_of(result, "y") == [2, 10]
    got = shm.get_contents_as_numpy(out_handle, np.float32, [2, 10])
    np.testing.assert_allclose(got, mlp_reference(front), rtol=1e-6)
    assert mapped(server, in_key) and mapped(server, out_key)

    front.client.unregister_system_shared_memory(in_name)
    assert list(front.regions()) == [out_name]
    assert mapped(server, in_key) == []  # unmapped, its descriptor closed
    front.client.unregister_system_shared_memory()
    assert front.regions() == {}
    assert mapped(server, out_key) == []


def test_one_region_holds_tensors_at_offsets_and_mixes_with_tensors_in_the_message(front,
                                                                                   objects):
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.full((2, 4), 0.5, np.float32)
    name, key, handle = objects(256, None)
    shm.set_shared_memory_region(handle, [a], offset=64)
    front.client.register_system_shared_memory(name, key, 192, offset=64)  # bytes 64..255
    assert front.regions()[name] == {"key": key, "offset": 64, "byte_size": 192}
    ta = front.lib.InferInput("a", [2, 4], "FP32")
    ta.set_shared_memory(name, a.nbytes)  # offset 0 of the region: byte 64 of the object
    tb = front.lib.InferInput("b", [2, 4], "FP32")
    tb.set_data_from_numpy(b)  # in the message
    out_sum = front.lib.InferRequestedOutput("sum")
    out_sum.set_shared_memory(name, a.nbytes, offset=96)
    out_diff = front.lib.InferRequestedOutput("diff")
    result = front.client.infer("pair", [ta, tb], outputs=[out_sum, out_diff])
    np.testing.assert_array_equal(result.as_numpy("diff"), a - b)
    np.testing.assert_array_equal(
        shm.get_contents_as_numpy(handle, np.float32, [2, 4], offset=64 + 96), a + b)


def test_bytes_tensors_go_through_shared_memory_in_the_binary_layout(front, objects):
    words = np.array([[b"hello", "w\u00f6rld".encode()], [b"", b"x y"]], dtype=np.object_)
    block = serialize_byte_tensor(words)
    size = serialized_byte_size(block)
    name, key, _ = objects(size, [block])
    out_name, out_key, out_handle = objects(256)
    front.client.register_system_shared_memory(name, key, size)
    front.client.register_system_shared_memory(out_name, out_key, 256)
    x = front.lib.InferInput("x", [2, 2], "BYTES")
    x.set_shared_memory(name, size)
    y = front.lib.InferRequestedOutput("y")
    y.set_shared_memory(out_name, 256)
    result = front.client.infer("text", [x], outputs=[y])
    assert front.shape_of(result, "y") == [2, 2]
    np.testing.assert_array_equal(
        shm.get_contents_as_numpy(out_handle, np.object_, [2, 2]), words)


# -- bad calls -----------------------------------------------------------------------------------


def test_registering_outside_the_object_or_with_a_bad_key_is_refused_naming_it(front, objects):
    name, key, _ = objects(1024)
    code, message = refused(front.client.register_system_shared_memory, name, key, 1024,
                            offset=8)
    assert code == front.bad and "offset 8 + byte_size 1024" in message and key in message
    code, message = refused(front.client.register_system_shared_memory, name, key, 0)
    assert code == front.bad and "byte_size" in message
    for bad_key in (f"/a/{key[1:]}", key[1:], "/..", "/", f"/{key[1:]}/"):
        code, message = refused(front.client.register_system_shared_memory, name, bad_key, 8)
        assert code == front.bad and repr(bad_key) in message, (bad_key, message)
    code, message = refused(front.client.register_system_shared_memory, name,
                            f"/mmc-spec-{os.getpid()}-missing", 8)
    assert code == front.bad and "no shared memory object with key" in message
    assert front.regions() == {}


def test_a_symlink_or_a_directory_under_dev_shm_is_never_mapped(front, objects):
    _, target_key, _ = objects(64)
    link = f"/dev/shm/mmc-spec-{os.getpid()}-{front.kind}-link"
    folder = f"/dev/shm/mmc-spec-{os.getpid()}-{front.kind}-dir"
    os.symlink(f"/dev/shm/{target_key[1:]}", link)
    os.mkdir(folder)
    try:
        for path in (link, folder):
            key = "/" + os.path.basename(path)
            code, message = refused(front.client.register_system_shared_memory, "r", key, 8)
            assert code == front.bad and f"'{key}'" in message, message
    finally:
        os.unlink(link)
        os.rmdir(folder)
    assert front.regions() == {}


def test_a_name_registered_twice_and_unknown_names_are_refused(front, objects):
    name, key, _ = objects(64)
    front.client.register_system_shared_memory(name, key, 64)
    code, message = refused(front.client.register_system_shared_memory, name, key, 64)
    assert code == front.bad and f"'{name}' is already registered" in message
    for call in (front.client.unregister_system_shared_memory,
                 front.client.get_system_shared_memory_status):
        code, message = refused(call, "nope")
        assert code == front.bad and "no shared memory region 'nope'" in message
        assert name in message  # and which ones there are


def test_the_server_maps_at_most_its_regions_and_bytes(front, objects):
    made = [objects(64) for _ in range(MAX_REGIONS + 1)]
    for name, key, _ in made[:MAX_REGIONS]:
        front.client.register_system_shared_memory(name, key, 64)
    name, key, _ = made[-1]
    code, message = refused(front.client.register_system_shared_memory, name, key, 64)
    assert code == front.bad and f"MMC_SHM_MAX_REGIONS={MAX_REGIONS}" in message
    front.client.unregister_system_shared_memory()
    big, big_key, _ = objects(MAX_BYTES + 1)
    code, message = refused(front.client.register_system_shared_memory, big, big_key,
                            MAX_BYTES + 1)
    assert code == front.bad and f"MMC_SHM_MAX_BYTES={MAX_BYTES}" in message
    front.client.register_system_shared_memory(big, big_key, MAX_BYTES)  # exactly the cap
    code, message = refused(front.client.register_system_shared_memory, name, key, 64)
    assert code == front.bad and "MMC_SHM_MAX_BYTES" in message


def test_tensors_outside_their_region_of_the_wrong_size_or_in_unknown_regions_are_refused(
        front, objects):
    name, key, _ = objects(X.nbytes + 64, [X])
    front.client.register_system_shared_memory(name, key, X.nbytes + 64)

    def infer_x(region: str, size: int, offset: int = 0, out=None):
        x = front.lib.InferInput("x", [2, 64], "FP32")
        x.set_shared_memory(region, size, offset=offset)
        return refused(front.client.infer, "mlp", [x], outputs=out)

    code, message = infer_x("nope", X.nbytes)
    assert code == front.bad and "input 'x'" in message and "'nope'" in message
    code, message = infer_x(name, X.nbytes, offset=128)
    assert code == front.bad and "input 'x'" in message and "past the end" in message
    code, message = infer_x(name, X.nbytes - 4)
    assert code == front.bad and "input 'x'" in message and f"needs {X.nbytes} bytes" in message
    small = front.lib.InferRequestedOutput("y")
    small.set_shared_memory(name, 40)  # y is 2 x 10 FP32: 80 bytes
    code, message = infer_x(name, X.nbytes, out=[small])
    assert code == front.bad and "output 'y'" in message and "80 bytes" in message


def test_a_region_whose_object_shrank_is_refused_not_read(front, objects):
    name, key, handle = objects(X.nbytes, [X])
    front.client.register_system_shared_memory(name, key, X.nbytes)
    fd = os.open(f"/dev/shm/{key[1:]}", os.O_RDWR)
    try:
        os.ftruncate(fd, 64)
    finally:
        os.close(fd)
    x = front.lib.InferInput("x", [2, 64], "FP32")
    x.set_shared_memory(name, X.nbytes)
    code, message = refused(front.client.infer, "mlp", [x])
    assert code == front.bad and "no longer fits its object" in message


def test_a_region_name_with_a_slash_is_refused(server):
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.SystemSharedMemoryRegister(pb.SystemSharedMemoryRegisterRequest(
                name="a/b", key="/whatever", byte_size=8))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'a/b'" in info.value.details()


def test_cuda_shared_memory_is_not_offered_and_says_why(server, front):
    code, message = refused(front.client.get_cuda_shared_memory_status)
    assert code == ("501" if front.kind == "http" else "StatusCode.UNIMPLEMENTED")
    assert "CUDA shared memory is not offered" in message
    assert ("CUDA IPC" if gpu_available() else "no GPU") in message


# -- off by default, one worker, released at shutdown ------------------------------------------


def test_shared_memory_is_off_unless_the_operator_turns_it_on():
    assert EdgeLimits.from_env({}).shared_memory is False
    assert EdgeLimits.from_env({"MMC_SHM": "on"}).shared_memory is True
    app = ServingApp(DataPlane(replica="r"), None, ServingSettings())

    async def calls():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://replica") as http:
            meta = await http.get("/v2")
            status = await http.get("/v2/systemsharedmemory/status")
            register = await http.post("/v2/systemsharedmemory/region/r/register",
                                       json={"key": "/k", "byte_size": 8})
            return meta, status, register

    meta, status, register = asyncio.run(calls())
    assert "system_shared_memory" not in meta.json()["extensions"]
    for answer in (status, register):
        assert answer.status_code == 501
        assert "MMC_SHM=on" in answer.json()["error"]


def test_regions_are_released_at_shutdown(tmp_path):
    key = f"/mmc-spec-{os.getpid()}-shutdown"
    handle = shm.create_shared_memory_region("s", key, 4096, create_only=True)
    try:
        registry = SharedMemoryRegistry(max_regions=2, max_bytes=8192)
        app = ServingApp(DataPlane(replica="r", shared_memory=registry), None,
                         ServingSettings())
        maps = Path("/proc/self/maps")

        def mappings() -> int:  # this process is the client too: it maps the object itself
            return maps.read_text().count(f"/dev/shm/{key[1:]}")

        client_only = mappings()
        registry.register(name="s", key=key, offset=0, byte_size=4096)
        assert mappings() == client_only + 1
        asyncio.run(app.shutdown())
        assert len(registry) == 0 and registry.registered_bytes == 0
        assert mappings() == client_only
    finally:
        shm.destroy_shared_memory_region(handle)


def test_with_shared_memory_on_mmc_serve_refuses_several_workers(tmp_path):
    (tmp_path / "models").mkdir()
    done = subprocess.run(
        [*serve_command(), "--model-repository", str(tmp_path / "models"), "--workers", "2"],
        env={**os.environ, "MMC_SHM": "on"}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--workers 2: with MMC_SHM=on the server runs one worker" in done.stderr

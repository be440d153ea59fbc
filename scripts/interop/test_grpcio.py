"""futureq interop suite with Python grpcio: publish, subscribe, cancel, errors, health,
reflection, shutdown.

Starts the broker binary given as argv[1] on free loopback ports with in-memory storage,
runs each check with a deadline, and prints one line per check plus 'N passed, M failed'.
Every check runs twice: over plaintext, then over TLS with a bearer token (certificates from
`futureq certs dev`, the token from `futureq token new`, grpcio's ssl_channel_credentials).
"""
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import grpc
import futureq_pb2 as pb
import futureq_pb2_grpc as pbg
import health_pb2
import health_pb2_grpc


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Broker:
    def __init__(self, binary, secure=False):
        self.dir = tempfile.TemporaryDirectory()
        self.port = free_port()
        self.secure = secure
        env = dict(os.environ)
        env.update({
            "FUTUREQ_API_GRPC_LISTEN": f"127.0.0.1:{self.port}",
            "FUTUREQ_OBSERVABILITY_METRICS_LISTEN": "",
            "FUTUREQ_STORAGE_MODE": "memory",
            "FUTUREQ_RUNTIME_CORES": "2",
            "FUTUREQ_DELIVERY_INFLIGHTTIMEOUT": "1s",
        })
        env.pop("RUST_LOG", None)
        if secure:
            certs = os.path.join(self.dir.name, "certs")
            subprocess.run([binary, "certs", "dev", "--out", certs], check=True,
                           stdout=subprocess.DEVNULL)
            out = subprocess.run([binary, "token", "new"], check=True, capture_output=True,
                                 text=True).stdout.split()
            self.token, token_hash = out[0], out[1]
            principals = os.path.join(self.dir.name, "principals.yaml")
            with open(principals, "w") as f:
                f.write("principals:\n- name: interop\n"
                        f"  tokens: [{token_hash}]\n"
                        "  publish: ['*']\n  consume: ['*']\n  admin: true\n")
            env.update({
                "FUTUREQ_API_GRPC_TLS_CERTFILE": os.path.join(certs, "node.pem"),
                "FUTUREQ_API_GRPC_TLS_KEYFILE": os.path.join(certs, "node-key.pem"),
                "FUTUREQ_API_AUTH_PRINCIPALSFILE": principals,
            })
            with open(os.path.join(certs, "ca.pem"), "rb") as f:
                self.ca = f.read()
        self.log = open(os.path.join(self.dir.name, "broker.log"), "w+")
        self.proc = subprocess.Popen([binary, "start"], cwd=self.dir.name, env=env,
                                     stdout=subprocess.DEVNULL, stderr=self.log)
        self.channel = self.new_channel()
        grpc.channel_ready_future(self.channel).result(timeout=20)

    def new_channel(self, token=True):
        """A channel to the broker: plaintext, or TLS verified against the dev CA with the
        principal's token on every call (none when `token` is False)."""
        target = f"127.0.0.1:{self.port}"
        if not self.secure:
            return grpc.insecure_channel(target)
        creds = grpc.ssl_channel_credentials(root_certificates=self.ca)
        if token:
            creds = grpc.composite_channel_credentials(
                creds, grpc.access_token_call_credentials(self.token))
        return grpc.secure_channel(target, creds)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.channel.close()


def batch(batch_id, msgs, level=pb.ACK_LEVEL_QUORUM):
    return pb.PublishBatch(batch_id=batch_id, ack_level=level, messages=msgs)


def publish(b, batches):
    stub = pbg.FutureQProducerStub(b.channel)
    return list(stub.PublishStream(iter(batches), timeout=10))


class Consumer:
    """A Subscribe stream whose request iterator is fed from a queue (for ACK frames)."""

    def __init__(self, b, topic, group=""):
        self.q = queue.Queue()
        self.q.put(pb.ConsumerFrame(init=pb.SubscribeInit(topic=topic, group_id=group)))
        self.stream = pbg.FutureQConsumerStub(b.channel).Subscribe(self._frames(), timeout=20)
        self.got = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _frames(self):
        while True:
            f = self.q.get()
            if f is None:
                return
            yield f

    def _read(self):
        try:
            for m in self.stream:
                self.got.put(m)
        except grpc.RpcError as e:
            self.got.put(e)

    def next(self, timeout):
        try:
            return self.got.get(timeout=timeout)
        except queue.Empty:
            return None

    def ack(self, tag, success=True):
        self.q.put(pb.ConsumerFrame(ack=pb.AckRequest(success=success, delivery_tag=tag)))

    def close(self):
        self.q.put(None)
        self.stream.cancel()


def check_health(b):
    stub = health_pb2_grpc.HealthStub(b.channel)
    r = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    assert r.status == health_pb2.HealthCheckResponse.SERVING, r
    try:
        stub.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=5)
        raise AssertionError("unknown service must fail")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.NOT_FOUND, e


def check_many_channels_share_one_connection(b):
    """Issue 26: grpcio's channels to one target share one HTTP/2 connection (its global
    subchannel pool). A dozen consumers, each on its own channel, and then a health check on a
    channel of its own: all answered (with the old default of 10 streams per connection the
    check waited in grpcio's queue until its deadline)."""
    channels = [b.new_channel() for _ in range(13)]
    consumers = []
    try:
        for i, ch in enumerate(channels[:12]):
            c = Consumer.__new__(Consumer)
            c.q = queue.Queue()
            c.q.put(pb.ConsumerFrame(init=pb.SubscribeInit(topic=f"py-many-{i}")))
            c.stream = pbg.FutureQConsumerStub(ch).Subscribe(c._frames(), timeout=30)
            c.got = queue.Queue()
            threading.Thread(target=c._read, daemon=True).start()
            consumers.append(c)
        time.sleep(0.3)
        stub = health_pb2_grpc.HealthStub(channels[12])
        r = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert r.status == health_pb2.HealthCheckResponse.SERVING, r
        acks = publish(b, [batch(1, [pb.PublishMessage(topic="py-many-11", payload=b"x")])])
        assert acks[0].success, acks
        m = consumers[11].next(5)
        assert isinstance(m, pb.QueueMessage) and m.payload == b"x", m
    finally:
        for c in consumers:
            c.close()
        for ch in channels:
            ch.close()


def check_publish_and_subscribe(b):
    c = Consumer(b, "py-orders")
    time.sleep(0.2)
    acks = publish(b, [batch(1, [pb.PublishMessage(topic="py-orders", payload=b"hello", delay_ms=200)])])
    assert len(acks) == 1 and acks[0].success and acks[0].batch_id == 1, acks
    assert len(acks[0].delivery_tags[0]) == 24
    m = c.next(5)
    assert isinstance(m, pb.QueueMessage), m
    assert m.payload == b"hello" and m.attempt == 1 and m.delivery_tag == acks[0].delivery_tags[0], m
    now = int(time.time() * 1000)
    assert now >= m.enqueued_at_unix_ms + m.delay_ms, "delivered early"
    c.ack(m.delivery_tag, False)  # NACK: redelivered at once
    m2 = c.next(5)
    assert isinstance(m2, pb.QueueMessage) and m2.attempt == 2, m2
    c.ack(m2.delivery_tag, True)
    assert c.next(1.5) is None, "acked message must not come back"
    c.close()


def check_cancel(b):
    c = Consumer(b, "py-cancel")
    time.sleep(0.2)
    acks = publish(b, [batch(1, [pb.PublishMessage(topic="py-cancel", payload=b"keep", delay_ms=2000),
                                 pb.PublishMessage(topic="py-cancel", payload=b"drop", delay_ms=2000),
                                 pb.PublishMessage(topic="py-cancel", payload=b"moved", delay_ms=600000)])])
    tags = acks[0].delivery_tags
    stub = pbg.FutureQProducerStub(b.channel)
    r = stub.Cancel(pb.CancelRequest(delivery_tags=[tags[1], b"\x00" * 24]), timeout=5)
    assert list(r.cancelled) == [True, False], r
    moved = stub.Reschedule(pb.RescheduleRequest(delivery_tag=tags[2], delay_ms=0), timeout=5)
    assert moved.found and moved.delivery_tag != tags[2], moved
    try:
        stub.Cancel(pb.CancelRequest(delivery_tags=[b"short"]), timeout=5)
        raise AssertionError("a 5-byte tag was accepted")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
        assert "delivery_tags[0]" in e.details(), e.details()
        assert error_info(e) == ("INVALID_ARGUMENT", "NOT_STORED"), error_info(e)
    got = {}
    for _ in range(2):
        m = c.next(8)
        assert isinstance(m, pb.QueueMessage), m
        got[m.payload] = m.delivery_tag
        c.ack(m.delivery_tag, True)
    assert got == {b"keep": tags[0], b"moved": moved.delivery_tag}, got
    assert c.next(1.0) is None, "a cancelled message was delivered"
    c.close()


def check_topic_stats_and_peek(b):
    acks = publish(b, [batch(1, [pb.PublishMessage(topic="py-stats", payload=b"one", delay_ms=600000),
                                 pb.PublishMessage(topic="py-stats", payload=b"two", delay_ms=900000)])])
    tags = acks[0].delivery_tags
    admin = pbg.FutureQAdminStub(b.channel)
    r = admin.TopicStats(pb.TopicStatsRequest(topic="py-stats"), timeout=5)
    assert [(t.topic, t.stored, t.in_flight) for t in r.topics] == [("py-stats", 2, 0)], r
    assert r.topics[0].next_due_unix_ms > 0, r
    page = admin.Peek(pb.PeekRequest(topic="py-stats", limit=1), timeout=5)
    assert [(m.payload, m.attempt) for m in page.messages] == [(b"one", 0)], page
    page = admin.Peek(pb.PeekRequest(topic="py-stats", limit=10, after_tag=tags[0]), timeout=5)
    assert [m.payload for m in page.messages] == [b"two"], page
    try:
        admin.Peek(pb.PeekRequest(topic="py-stats"), timeout=5)
        raise AssertionError("limit 0 was accepted")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
        assert "limit" in e.details(), e.details()
    stub = pbg.FutureQProducerStub(b.channel)
    assert list(stub.Cancel(pb.CancelRequest(delivery_tags=list(tags)), timeout=5).cancelled) == [True, True]
    r = admin.TopicStats(pb.TopicStatsRequest(topic="py-stats"), timeout=5)
    assert r.topics[0].stored == 0, r


def check_groups(b):
    c = Consumer(b, "py-groups", group="py-workers")
    time.sleep(0.2)
    admin = pbg.FutureQAdminStub(b.channel)
    r = admin.TopicStats(pb.TopicStatsRequest(topic="py-groups"), timeout=5)
    assert [(g.group, g.consumers) for g in r.topics[0].groups] == [("py-workers", 1)], r
    done = admin.DeleteGroup(pb.DeleteGroupRequest(topic="py-groups", group="py-workers"), timeout=5)
    assert done.found and done.consumers_ended == 1, done
    end = c.next(5)
    assert isinstance(end, grpc.RpcError) and end.code() == grpc.StatusCode.NOT_FOUND, end
    r = admin.TopicStats(pb.TopicStatsRequest(topic="py-groups"), timeout=5)
    assert list(r.topics[0].groups) == [], r
    try:
        admin.DeleteGroup(pb.DeleteGroupRequest(topic="py-groups"), timeout=5)
        raise AssertionError("an empty group was accepted")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
        assert "group" in e.details(), e.details()
    c.close()


def check_publish_errors(b):
    acks = publish(b, [
        batch(1, []),
        batch(2, [pb.PublishMessage(topic="", payload=b"x")]),
        batch(3, [pb.PublishMessage(topic="t", payload=b"x", delay_ms=-5)]),
        batch(4, [pb.PublishMessage(topic="t", payload=b"x")]),
    ])
    assert [a.batch_id for a in acks] == [1, 2, 3, 4], acks
    assert [a.success for a in acks] == [False, False, False, True], acks
    assert all(a.error_code == grpc.StatusCode.INVALID_ARGUMENT.value[0] for a in acks[:3]), acks
    assert "messages[0].topic" in acks[1].error_message, acks[1]
    assert "messages[0].delay_ms" in acks[2].error_message, acks[2]
    # Typed: a client decides on the reason and the outcome, never on the text.
    assert all(a.error_reason == pb.ERROR_REASON_INVALID_ARGUMENT for a in acks[:3]), acks
    assert all(a.write_outcome == pb.WRITE_OUTCOME_NOT_STORED for a in acks[:3]), acks
    assert acks[3].error_reason == pb.ERROR_REASON_UNSPECIFIED, acks[3]


def check_subscribe_error(b):
    stub = pbg.FutureQConsumerStub(b.channel)
    try:
        list(stub.Subscribe(iter([pb.ConsumerFrame(init=pb.SubscribeInit(topic=""))]), timeout=5))
        raise AssertionError("empty topic must fail")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
        assert "topic" in e.details(), e.details()
        assert error_info(e) == ("INVALID_ARGUMENT", "NOT_STORED"), error_info(e)


def error_info(e):
    """The (reason, outcome) of a refusal's google.rpc.ErrorInfo, read with grpcio-status."""
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status
    status = rpc_status.from_call(e)
    assert status is not None, "no grpc-status-details-bin"
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info) and info.domain == "futureq":
            return info.reason, info.metadata["outcome"]
    raise AssertionError(f"no futureq ErrorInfo in {status}")


def check_undecodable_frame(b):
    raw = b.channel.stream_stream("/futureq.FutureQProducer/PublishStream")
    try:
        list(raw(iter([b"\x0a\xff\xff"]), timeout=5))
        raise AssertionError("an undecodable frame must end the stream")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
        assert "PublishBatch" in e.details(), e.details()


def check_cluster_info(b):
    r = pbg.FutureQClusterStub(b.channel).GetClusterInfo(pb.ClusterInfoRequest(), timeout=5)
    assert r.leader_address == f"127.0.0.1:{b.port}" and len(r.nodes) == 1, r


def check_reflection(b):
    # grpcio-reflection's descriptor database speaks grpc.reflection.v1alpha.
    from google.protobuf.descriptor_pool import DescriptorPool
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )
    db = ProtoReflectionDescriptorDatabase(b.channel)
    services = set(db.get_services())
    want = {"futureq.FutureQProducer", "futureq.FutureQConsumer", "futureq.FutureQCluster",
            "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection"}
    assert want <= services, services
    pool = DescriptorPool(db)
    method = pool.FindServiceByName("futureq.FutureQProducer").methods_by_name["PublishStream"]
    assert method.input_type.full_name == "futureq.PublishBatch", method.input_type.full_name
    assert pool.FindMessageTypeByName("futureq.QueueMessage").fields_by_name["delivery_tag"]
    try:
        pool.FindMessageTypeByName("futureq.Nope")
        raise AssertionError("an unknown symbol was found")
    except KeyError:
        pass


def check_credentials(b):
    """Over TLS: a call without a token is UNAUTHENTICATED (health stays open); plaintext on
    the TLS port is refused."""
    if not b.secure:
        return
    ch = b.new_channel(token=False)
    try:
        try:
            pbg.FutureQClusterStub(ch).GetClusterInfo(pb.ClusterInfoRequest(), timeout=5)
            raise AssertionError("served without a token")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAUTHENTICATED, e
            assert error_info(e) == ("UNAUTHENTICATED", "NOT_STORED"), error_info(e)
        r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert r.status == health_pb2.HealthCheckResponse.SERVING, r
    finally:
        ch.close()
    plain = grpc.insecure_channel(f"127.0.0.1:{b.port}")
    try:
        health_pb2_grpc.HealthStub(plain).Check(health_pb2.HealthCheckRequest(service=""), timeout=3)
        raise AssertionError("plaintext served on the TLS port")
    except grpc.RpcError as e:
        assert e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), e
    finally:
        plain.close()


def check_sigterm(b):
    c = Consumer(b, "py-shutdown")
    time.sleep(0.2)
    b.proc.send_signal(signal.SIGTERM)
    code = b.proc.wait(timeout=10)
    assert code == 0, f"exit code {code}"
    end = c.next(5)
    assert isinstance(end, grpc.RpcError) and end.code() == grpc.StatusCode.UNAVAILABLE, end


def run_pass(binary, secure):
    b = Broker(binary, secure)
    mode = "tls+token" if secure else "plaintext"
    passed = failed = 0
    checks = [check_health, check_many_channels_share_one_connection, check_publish_and_subscribe, check_cancel, check_topic_stats_and_peek,
              check_groups,
              check_publish_errors,
              check_subscribe_error, check_undecodable_frame, check_cluster_info, check_reflection,
              check_credentials, check_sigterm]
    try:
        for check in checks:
            t = time.time()
            try:
                check(b)
                passed += 1
                print(f"ok   [{mode}] {check.__name__} ({time.time() - t:.2f}s)")
            except Exception as e:  # noqa: BLE001 - report every failure and go on
                failed += 1
                print(f"FAIL [{mode}] {check.__name__}: {e!r}")
    finally:
        b.close()
        if failed:
            b.log.seek(0)
            print("--- broker log ---\n" + b.log.read())
    return passed, failed


def main():
    binary = sys.argv[1]
    passed = failed = 0
    for secure in (False, True):
        p, f = run_pass(binary, secure)
        passed, failed = passed + p, failed + f
    print(f"interop: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

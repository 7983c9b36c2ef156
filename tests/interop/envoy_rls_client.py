"""Drives tollgate's gRPC API with a third-party Envoy RLS v3 client.

grpcio carries the calls; the message classes come from the `envoy-data-plane` package
(generated from Envoy's own protos), so the bytes on the wire are exactly what any other RLS
client would send. Usage: envoy_rls_client.py HOST:PORT [CA.pem]; with a CA file the channel
is TLS, verified against that CA (the server runs with --grpc-tls-cert). The policy the server runs is in
crates/tollgate-cli/tests/e2e_python_grpcio.rs. Exits non-zero with a message on any mismatch.
"""

import sys

import grpc
from envoy_data_plane.envoy.extensions.common.ratelimit.v3 import (
    RateLimitDescriptor,
    RateLimitDescriptorEntry,
)
from envoy_data_plane.envoy.service.ratelimit.v3 import (
    RateLimitRequest,
    RateLimitResponseCode,
    RateLimitServiceSyncStub,
)


def check(stub, entries, hits=0, descriptor_hits=None):
    request = RateLimitRequest(
        domain="interop",
        descriptors=[
            RateLimitDescriptor(
                entries=[RateLimitDescriptorEntry(key=k, value=v) for k, v in e],
                hits_addend=descriptor_hits,
            )
            for e in entries
        ],
        hits_addend=hits,
    )
    return stub.should_rate_limit(request)


def expect(condition, message):
    if not condition:
        print("FAIL:", message, file=sys.stderr)
        sys.exit(1)


def main():
    target = sys.argv[1]
    if len(sys.argv) > 2:
        with open(sys.argv[2], "rb") as ca:
            credentials = grpc.ssl_channel_credentials(root_certificates=ca.read())
        channel = grpc.secure_channel(target, credentials)
    else:
        channel = grpc.insecure_channel(target)
    with channel:
        grpc.channel_ready_future(channel).result(timeout=10)
        stub = RateLimitServiceSyncStub(channel)

        codes = []
        for _ in range(4):
            response = check(stub, [[("client", "py")]])
            codes.append(response.overall_code)
            status = response.statuses[0]
            expect(status.current_limit.name == "per_client", f"limit name {status.current_limit.name!r}")
            expect(status.current_limit.requests_per_unit == 3, "requests_per_unit")
        expect(
            codes == [RateLimitResponseCode.OK] * 3 + [RateLimitResponseCode.OVER_LIMIT],
            f"codes {codes}",
        )
        denied = check(stub, [[("client", "py")]])
        expect(denied.statuses[0].limit_remaining == 0, "remaining after the limit")
        reset = denied.statuses[0].duration_until_reset
        expect(reset is not None and reset.total_seconds() > 0, f"duration_until_reset {reset}")
        headers = {h.key: h.value for h in denied.response_headers_to_add}
        expect(headers.get("x-ratelimit-limit") == "3", f"headers {headers}")
        expect(int(headers.get("retry-after", "0")) >= 1, f"headers {headers}")

        # Two descriptors, statuses in request order; hits_addend weighs the request.
        response = check(stub, [[("unknown", "x")], [("client", "heavy")]], hits=2)
        expect(response.overall_code == RateLimitResponseCode.OK, "weighted request allowed")
        expect(response.statuses[0].current_limit is None, "unmatched descriptor has no limit")
        expect(response.statuses[1].limit_remaining == 1, f"remaining {response.statuses[1].limit_remaining}")

        # Answers as envoyproxy/ratelimit sends them: `current_limit.name` is the configured
        # name, empty without one; `duration_until_reset` in whole seconds (the ceiling of the
        # wait); an unlimited rule's `limit_remaining` is 4294967295, with no current limit.
        response = check(stub, [[("anon", "a")], [("free", "yes")], [("client", "wire")]])
        expect(response.overall_code == RateLimitResponseCode.OK, "wire answers allowed")
        anon, free, named = response.statuses
        expect(anon.current_limit.name == "", f"unnamed rule's name {anon.current_limit.name!r}")
        expect(named.current_limit.name == "per_client", f"name {named.current_limit.name!r}")
        for status in (anon, named):
            reset = status.duration_until_reset
            expect(reset.microseconds == 0, f"duration_until_reset {reset!r} in whole seconds")
        expect(1 <= anon.duration_until_reset.total_seconds() <= 60, f"reset {anon.duration_until_reset!r}")
        expect(free.code == RateLimitResponseCode.OK, "unlimited is OK")
        expect(free.limit_remaining == 4294967295, f"unlimited remaining {free.limit_remaining}")
        expect(free.current_limit is None, "unlimited has no current limit")
        expect(free.duration_until_reset is None, "unlimited has no reset")

        # `requests_per_unit: 0` blocks: OVER_LIMIT every time, until the end of the unit.
        for _ in range(2):
            response = check(stub, [[("anon", "blocked")]])
            expect(response.overall_code == RateLimitResponseCode.OVER_LIMIT, "a block denies")
            status = response.statuses[0]
            expect(status.current_limit.requests_per_unit == 0, "a block's limit is 0")
            expect(status.current_limit.name == "blocklist", f"name {status.current_limit.name!r}")
            seconds = status.duration_until_reset.total_seconds()
            expect(1 <= seconds <= 3600 and seconds == int(seconds), f"block reset {seconds}")

        # A descriptor's hits_addend of 0 (an empty UInt64Value on the wire) checks without
        # counting; on a limit exactly used up it is still OK, as envoyproxy/ratelimit answers.
        for _ in range(2):
            response = check(stub, [[("client", "checker")]], descriptor_hits=0)
            expect(response.overall_code == RateLimitResponseCode.OK, "a check is allowed")
            expect(response.statuses[0].limit_remaining == 3, "a check counts nothing")
        check(stub, [[("client", "checker")]], descriptor_hits=3)
        response = check(stub, [[("client", "checker")]], descriptor_hits=0)
        expect(response.overall_code == RateLimitResponseCode.OK, "used up, not past it")
        expect(response.statuses[0].limit_remaining == 0, "nothing left")

        try:
            check(stub, [[("", "empty key")]])
            expect(False, "an empty key must be rejected")
        except grpc.RpcError as error:
            expect(error.code() == grpc.StatusCode.INVALID_ARGUMENT, f"code {error.code()}")

        # Bytes that are no protobuf message: INTERNAL with the decoder's reason, as any gRPC
        # server answers them.
        raw = channel.unary_unary(
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        try:
            raw(b"\xff\xff\xff\xff")
            expect(False, "malformed protobuf must be rejected")
        except grpc.RpcError as error:
            expect(error.code() == grpc.StatusCode.INTERNAL, f"code {error.code()}")
            expect("failed to decode" in error.details(), f"details {error.details()!r}")
    print("interop ok: 4 requests, 1 weighted request, wire answers, 2 blocks, 3 checks, 2 invalid requests")


if __name__ == "__main__":
    main()

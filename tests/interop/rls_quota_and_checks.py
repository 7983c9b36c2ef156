"""Drives tollgate's gRPC API with a third-party Envoy RLS v3 client (grpcio and the message
classes of `envoy-data-plane`) for two answers that follow envoyproxy/ratelimit: quota-mode
descriptors, and a check (`hits_addend: 0`) on a limit exactly used up.

Usage: rls_quota_and_checks.py HOST:PORT DEFAULT_CHARGE, DEFAULT_CHARGE being the server's
`--default-charge` (whole or up_to_limit). The policy the server runs is in
crates/tollgate-cli/tests/e2e/e2e_rls_quota.rs. Exits non-zero with a message on any mismatch.
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

OK = RateLimitResponseCode.OK
OVER = RateLimitResponseCode.OVER_LIMIT


def expect(condition, message):
    if not condition:
        print("FAIL:", message, file=sys.stderr)
        sys.exit(1)


class Client:
    def __init__(self, stub):
        self.stub = stub

    def ask(self, descriptors, hits=None):
        """descriptors: (key, value) pairs, one descriptor each; hits: every descriptor's
        hits_addend (None: the request's default of 1)."""
        request = RateLimitRequest(
            domain="quota",
            descriptors=[
                RateLimitDescriptor(
                    entries=[RateLimitDescriptorEntry(key=k, value=v)],
                    hits_addend=hits,
                )
                for k, v in descriptors
            ],
        )
        return self.stub.should_rate_limit(request)

    def codes(self, descriptors, hits=None):
        response = self.ask(descriptors, hits)
        return response.overall_code, [s.code for s in response.statuses], response


def quota_mode(client):
    three = [("plain", "a"), ("qa", "a"), ("qb", "a")]
    overall, codes, _ = client.codes(three)
    expect((overall, codes) == (OK, [OK, OK, OK]), f"all under: {overall} {codes}")
    # One quota descriptor over, the other not: OK; the over one reports OVER_LIMIT.
    overall, codes, response = client.codes(three)
    expect((overall, codes) == (OK, [OK, OVER, OK]), f"one quota over: {overall} {codes}")
    expect(response.statuses[0].limit_remaining == 8, "the plain limit is charged")
    expect(response.statuses[2].limit_remaining == 0, "the quota limit that admits is charged")
    # Every quota descriptor over: OVER_LIMIT, and nothing is charged.
    overall, codes, response = client.codes(three)
    expect((overall, codes) == (OVER, [OK, OVER, OVER]), f"all quota over: {overall} {codes}")
    expect(response.statuses[0].limit_remaining == 8, "a denial charges nothing")
    _, _, response = client.codes([("plain", "a")])
    expect(response.statuses[0].limit_remaining == 7, "still nothing charged")

    # A lone quota descriptor over is every quota descriptor over.
    expect(client.codes([("qa", "b")])[:2] == (OK, [OK]), "a first quota request")
    expect(client.codes([("qa", "b")])[:2] == (OVER, [OVER]), "a lone quota over")
    # An ordinary descriptor over denies whatever the quota descriptors say.
    client.codes([("plain", "b")] * 10)
    overall, codes, _ = client.codes([("plain", "b"), ("qb", "b")])
    expect((overall, codes) == (OVER, [OVER, OK]), f"ordinary over: {overall} {codes}")

    # Shadow mode: a shadow quota descriptor over reports OK, so the quota descriptors are not
    # all over and the request is OK although the enforced one is over.
    client.codes([("qs", "c")])
    expect(client.codes([("qs", "c")])[:2] == (OK, [OK]), "a shadow quota over is OK")
    client.codes([("qa", "c")])
    overall, codes, _ = client.codes([("plain", "c"), ("qa", "c"), ("qs", "c")])
    expect((overall, codes) == (OK, [OK, OVER, OK]), f"with a shadow quota: {overall} {codes}")


def checks(client, default_charge):
    # A rule without `charge`, used up exactly: charged whole (the default), a check is OK, as
    # envoyproxy/ratelimit answers; charged up to the limit (--default-charge), it is over.
    overall, _, response = client.codes([("user", "d")], hits=2)
    expect(overall == OK and response.statuses[0].limit_remaining == 0, "used up")
    overall, _, response = client.codes([("user", "d")], hits=0)
    if default_charge == "up_to_limit":
        expect(overall == OVER, f"a check on a used-up token budget: {overall}")
    else:
        expect(overall == OK, f"a check on a used-up limit: {overall}")
    expect(response.statuses[0].limit_remaining == 0, "a check counts nothing")
    expect(client.codes([("user", "d")], hits=1)[0] == OVER, "one more is over")

    # A token budget (`charge: up_to_limit`): a check, an overshooting charge that uses up
    # what is left, then a check that is over.
    expect(client.codes([("tokens", "e")], hits=0)[0] == OK, "a check before")
    overall, _, response = client.codes([("tokens", "e")], hits=8)
    expect(overall == OK and response.statuses[0].limit_remaining == 0, "charged up to the limit")
    expect(client.codes([("tokens", "e")], hits=0)[0] == OVER, "a check after the overshoot")

    # A rule without `charge`, as xDS sends them: the server's --default-charge decides.
    expect(client.codes([("xds", "f")], hits=0)[0] == OK, "a check before")
    overall, _, response = client.codes([("xds", "f")], hits=8)
    if default_charge == "up_to_limit":
        expect(overall == OK and response.statuses[0].limit_remaining == 0, "charged up to 5")
        expect(client.codes([("xds", "f")], hits=0)[0] == OVER, "a check after the overshoot")
    else:
        expect(overall == OVER and response.statuses[0].limit_remaining == 5, "charged whole")
        expect(client.codes([("xds", "f")], hits=0)[0] == OK, "nothing was charged")


def main():
    target, default_charge = sys.argv[1], sys.argv[2]
    with grpc.insecure_channel(target) as channel:
        grpc.channel_ready_future(channel).result(timeout=10)
        client = Client(RateLimitServiceSyncStub(channel))
        if default_charge == "whole":
            quota_mode(client)
        checks(client, default_charge)
    print(f"interop ok: quota mode and checks (default charge {default_charge})")


if __name__ == "__main__":
    main()

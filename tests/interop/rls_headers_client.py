"""Prints the response headers a server adds to Envoy RLS v3 answers, as a third-party client
(grpcio, with `envoy-data-plane`'s message classes) receives them.

Usage: rls_headers_client.py HOST:PORT DOMAIN KEY VALUE COUNT. Sends COUNT checks of one
descriptor KEY=VALUE in DOMAIN and prints one line per answer: the overall code's name, then
each header as NAME=VALUE, separated by spaces. The test that runs it asserts on the lines
(crates/tollgate-cli/tests/e2e/e2e_upstream_env.rs).
"""

import sys

import grpc
from envoy_data_plane.envoy.extensions.common.ratelimit.v3 import (
    RateLimitDescriptor,
    RateLimitDescriptorEntry,
)
from envoy_data_plane.envoy.service.ratelimit.v3 import (
    RateLimitRequest,
    RateLimitServiceSyncStub,
)


def main():
    target, domain, key, value, count = sys.argv[1:6]
    with grpc.insecure_channel(target) as channel:
        grpc.channel_ready_future(channel).result(timeout=10)
        stub = RateLimitServiceSyncStub(channel)
        for _ in range(int(count)):
            request = RateLimitRequest(
                domain=domain,
                descriptors=[
                    RateLimitDescriptor(
                        entries=[RateLimitDescriptorEntry(key=key, value=value)]
                    )
                ],
                hits_addend=1,
            )
            response = stub.should_rate_limit(request)
            headers = [f"{h.key}={h.value}" for h in response.response_headers_to_add]
            print(" ".join([response.overall_code.name] + headers))


if __name__ == "__main__":
    main()

#!/bin/sh
# Container entry point: runs `tollgate ARGS`. For `serve` without an --admin-addr of its own,
# the admin API listens on all interfaces when a token is mounted (and requires it), else on
# the container's loopback only: tollgate refuses a reachable admin API without a token.
#   TOLLGATE_ADMIN_TOKEN_FILE  where the token is mounted (default /run/secrets/tollgate/admin-token)
#   TOLLGATE_ADMIN_PORT        the admin port (default 9090, tollgate's own default)
set -eu
token_file="${TOLLGATE_ADMIN_TOKEN_FILE:-/run/secrets/tollgate/admin-token}"
admin_port="${TOLLGATE_ADMIN_PORT:-9090}"
if [ "${1:-}" = serve ]; then
  shift
  case " $* " in
    *" --admin-addr "* | *" --admin-addr="*) set -- serve "$@" ;;
    *)
      if [ -s "$token_file" ]; then
        set -- serve --admin-addr "0.0.0.0:$admin_port" --admin-token-file "$token_file" "$@"
      else
        set -- serve --admin-addr "127.0.0.1:$admin_port" "$@"
      fi
      ;;
  esac
fi
exec tollgate "$@"

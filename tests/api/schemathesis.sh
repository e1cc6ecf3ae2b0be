#!/usr/bin/env bash
# schemathesis against the OpenAPI document of a running rtgtd: every operation with
# generated valid and invalid requests; fails on a server error or an answer the document
# does not allow. Usage: schemathesis.sh http://127.0.0.1:PORT TOKEN_FILE (the admin token).
set -euo pipefail
url=${1:?usage: schemathesis.sh http://HOST:PORT TOKEN_FILE}
token=$(cat "${2:?usage: schemathesis.sh http://HOST:PORT TOKEN_FILE}")
here=$(cd "$(dirname "$0")" && pwd)
# Backstore paths in generated bodies are made relative (the daemon's state directory),
# so a generated absolute path never names a file elsewhere on the host.
export SCHEMATHESIS_HOOKS=hooks
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
run() {
    schemathesis run "$url/api/v1/openapi.json" \
        --header "Authorization: Bearer $token" \
        --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
        --phases examples,coverage,fuzzing \
        --workers 1 \
        --max-examples "${SCHEMATHESIS_EXAMPLES:-25}" \
        --request-timeout 30 \
        --suppress-health-check all \
        --seed "${SCHEMATHESIS_SEED:-1}" \
        --no-color \
        "$@"
}
# Reads, creations and replacements first, then deletions, then whole documents: a
# generated empty document or a deleted target would leave the others nothing to reach.
run --exclude-method DELETE --exclude-name "PUT /api/v1/config"
run --include-method DELETE
run --include-name "PUT /api/v1/config"

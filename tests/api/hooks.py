"""schemathesis hooks for rtgt's API tests: generated backstore paths stay inside the
daemon's state directory."""

import random

import schemathesis


def _relative(value):
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k == "path" and isinstance(v, str):
                v = "gen-" + "".join(c for c in v if c.isalnum())[:32] + ".img"
            elif k == "token_file" and isinstance(v, str):
                v = "gen-token"
            out[k] = _relative(v)
        return out
    if isinstance(value, list):
        return [_relative(v) for v in value]
    return value


@schemathesis.hook
def map_body(ctx, body):
    return _relative(body)


# Most generated requests name objects of the test daemon, so that the operations below
# a target reach their handlers instead of ending at 404.
_KNOWN = {
    "target": "iqn.2025-01.io.rtgt:api",
    "tag": 1,
    "initiator": "iqn.2025-01.io.rtgt:host-a",
    "name": "spare",
    "lun": 0,
}
_rng = random.Random(1)


@schemathesis.hook
def map_path_parameters(ctx, path_parameters):
    if path_parameters and _rng.random() < 0.7:
        for k, v in _KNOWN.items():
            if k in path_parameters:
                path_parameters[k] = v
    return path_parameters

#!/usr/bin/env python3
"""Rebuilds the seed corpus in this directory from packet captures.

    fuzz/seeds/extract.py [--sessions PCAP...] [--scenarios PCAP...]

* transport_packet, transport_cm, transport_responder and the iSER login of iscsi_login/iscsi_text come from
  transport/tests/fixtures/lio-iser-srp.pcap (Linux rdma_rxe initiators and LIO).
* The iSCSI/TCP seeds come from tcpdump captures on lo of initiators talking to rtgtd (see
  fuzz/README.md): every connection of a --sessions capture gives its login (iscsi_login),
  its text segments (iscsi_text) and its two byte streams (iscsi_bhs); the SCSI commands of
  a --scenarios capture (one iscsi-test-cu test each) become one scsi_cdb and one
  scsi_params seed.
* config_yaml seeds are written by hand; this script leaves them alone.

Input formats are those documented on the functions of fuzz/src/. Files are named after
what they hold; the script only adds or overwrites files.
"""

import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
LIO_PCAP = os.path.join(ROOT, 'transport/tests/fixtures/lio-iser-srp.pcap')

# The targets of rtgt_fuzz::iscsi_login's registry.
OPEN_TARGET = b'iqn.2025-01.io.rtgt:open'

# --- pcap -------------------------------------------------------------------------------


def records(path):
    """(frame number, timestamp, Ethernet frame) of a classic pcap file."""
    with open(path, 'rb') as f:
        hdr = f.read(24)
        assert struct.unpack('<I', hdr[:4])[0] == 0xa1b2c3d4, path
        assert struct.unpack('<I', hdr[20:24])[0] == 1, 'not Ethernet'
        n = 0
        while True:
            rh = f.read(16)
            if len(rh) < 16:
                return
            sec, usec, incl, _ = struct.unpack('<IIII', rh)
            n += 1
            yield n, sec + usec / 1e6, f.read(incl)


def ipv4(frame):
    """(IPv4 datagram, its header length), or None."""
    if struct.unpack('>H', frame[12:14])[0] != 0x0800:
        return None
    ip = frame[14:]
    tot = struct.unpack('>H', ip[2:4])[0]
    return ip[:tot], (ip[0] & 15) * 4


def tcp_connections(path):
    """Every TCP connection as {'ts', 'c2s', 's2c', 'c2s_marks', 's2c_marks'}; a stream
    stops at the first hole, marks are (stream offset, timestamp)."""
    conns, order = {}, []
    for _, ts, frame in records(path):
        got = ipv4(frame)
        if not got or got[0][9] != 6:
            continue
        ip, ihl = got
        tcp = ip[ihl:]
        sport, dport, seq = struct.unpack('>HHI', tcp[:8])
        flags, payload = tcp[13], tcp[(tcp[12] >> 4) * 4:]
        src, dst = (ip[12:16], sport), (ip[16:20], dport)
        key = tuple(sorted([src, dst]))
        c = conns.get(key)
        if c is None or (flags & 0x12 == 0x02 and c.get('closed')):
            c = {'client': src, 'server': dst, 'dirs': {}, 'ts': ts}
            conns[key] = c
            order.append(c)
        d = c['dirs'].setdefault(src, {'isn': None, 'segs': {}})
        if flags & 0x02:
            d['isn'] = seq
            continue
        if d['isn'] is None:
            d['isn'] = (seq - 1) & 0xffffffff
        if payload:
            d['segs'].setdefault((seq - d['isn'] - 1) & 0xffffffff, (ts, payload))
        if flags & 0x05:
            c['closed'] = True
    out = []
    for c in order:
        res = {'ts': c['ts']}
        for name, ep in (('c2s', c['client']), ('s2c', c['server'])):
            segs = c['dirs'].get(ep, {'segs': {}})['segs']
            data, marks = bytearray(), []
            for rel in sorted(segs):
                ts, p = segs[rel]
                if rel + len(p) <= len(data):
                    continue
                if rel > len(data):
                    break
                marks.append((len(data), ts))
                data += p[len(data) - rel:]
            res[name], res[name + '_marks'] = bytes(data), marks
        out.append(res)
    return out


# --- iSCSI ------------------------------------------------------------------------------

LOGIN_REQ, TEXT_REQ, LOGIN_RSP, TEXT_RSP = 0x03, 0x04, 0x23, 0x24


def pad4(n):
    return (4 - (n & 3)) & 3


def text_pairs(data):
    return [tuple(item.split(b'=', 1)) for item in data.split(b'\0') if b'=' in item]


def split_pdus(stream, marks, hd, dd):
    """PDUs of one direction; digests (when negotiated) start after the login phase."""
    pdus, p, login, mi = [], 0, True, 0
    while p + 48 <= len(stream):
        bhs = stream[p:p + 48]
        if login and bhs[0] & 0x3f not in (LOGIN_REQ, LOGIN_RSP):
            login = False
        h, d = hd and not login, dd and not login
        ahs_len, dlen = bhs[4] * 4, int.from_bytes(bhs[5:8], 'big')
        total = 48 + ahs_len + 4 * h + dlen + pad4(dlen) + (4 if d and dlen else 0)
        if p + total > len(stream):
            break
        while mi + 1 < len(marks) and marks[mi + 1][0] <= p:
            mi += 1
        ds = p + 48 + ahs_len + 4 * h
        pdus.append({'ts': marks[mi][1] if marks else 0, 'bhs': bhs, 'off': p, 'len': total,
                     'ahs': stream[p + 48:p + 48 + ahs_len], 'data': stream[ds:ds + dlen],
                     'login': login})
        p += total
    return pdus


def iscsi_connections(path):
    out = []
    for c in tcp_connections(path):
        hd = dd = False
        for pdu in split_pdus(c['s2c'], c['s2c_marks'], False, False):
            if pdu['bhs'][0] & 0x3f != LOGIN_RSP:
                break
            for k, v in text_pairs(pdu['data']):
                hd = v == b'CRC32C' if k == b'HeaderDigest' else hd
                dd = v == b'CRC32C' if k == b'DataDigest' else dd
        c['hd'], c['dd'] = hd, dd
        c['init'] = split_pdus(c['c2s'], c['c2s_marks'], hd, dd)
        c['tgt'] = split_pdus(c['s2c'], c['s2c_marks'], hd, dd)
        names = [v for p in c['init'] if p['bhs'][0] & 0x3f == LOGIN_REQ
                 for k, v in text_pairs(p['data']) if k == b'InitiatorName']
        c['initiator'] = names[0] if names else b''
        if c['init']:
            out.append(c)
    return out


def cdb_len(opcode):
    return {0: 6, 1: 10, 2: 10, 4: 16, 5: 12}.get(opcode >> 5, 16)


def scsi_commands(conns):
    """(ts, initiator, cdb, edtl, data-out) of every SCSI Command, in time order; data-out
    is the immediate data plus the Data-Out PDUs of the same ITT."""
    cmds = []
    for c in conns:
        by_itt = {}
        for p in c['init']:
            b = p['bhs']
            op, itt = b[0] & 0x3f, b[16:20]
            if op == 0x01:
                cdb = bytes(b[32:48])[:cdb_len(b[32])]
                if p['ahs'] and p['ahs'][2] == 1:  # extended CDB AHS
                    cdb = bytes(b[32:48]) + p['ahs'][4:3 + struct.unpack('>H', p['ahs'][:2])[0]]
                edtl = struct.unpack('>I', b[20:24])[0]
                cmd = [p['ts'], c['initiator'], cdb, edtl, bytearray(p['data'])]
                by_itt[itt] = cmd
                cmds.append(cmd)
            elif op == 0x05 and itt in by_itt:
                offset = struct.unpack('>I', b[40:44])[0]
                buf = by_itt[itt][4]
                if offset > len(buf):
                    buf += bytes(offset - len(buf))
                buf[offset:offset + len(p['data'])] = p['data']
    cmds.sort(key=lambda x: x[0])
    return cmds


# --- writing ----------------------------------------------------------------------------

written = {}


def seed(target, name, data):
    d = os.path.join(HERE, target)
    os.makedirs(d, exist_ok=True)
    data = bytes(data)
    if data in written.setdefault(target, set()):
        return
    written[target].add(data)
    with open(os.path.join(d, name), 'wb') as f:
        f.write(data)


def login_records(pdus):
    out = bytearray()
    for p in pdus:
        out += p['bhs'] + struct.pack('>H', len(p['data'])) + p['data']
    return out


def retarget(pdus):
    """The login PDUs with TargetName replaced by the open target of iscsi_login."""
    out = []
    for p in pdus:
        pairs = [(k, OPEN_TARGET if k == b'TargetName' else v) for k, v in text_pairs(p['data'])]
        data = b''.join(k + b'=' + v + b'\0' for k, v in pairs)
        bhs = bytearray(p['bhs'])
        bhs[5:8] = len(data).to_bytes(3, 'big')
        out.append({'bhs': bytes(bhs), 'data': data})
    return out


# --- RoCE (lio-iser-srp.pcap) -----------------------------------------------------------

ROCE_OPS = {0: 'rc-send-first', 1: 'rc-send-middle', 2: 'rc-send-last', 4: 'rc-send-only',
            6: 'rc-write-first', 7: 'rc-write-middle', 8: 'rc-write-last',
            10: 'rc-write-only', 12: 'rc-read-request', 13: 'rc-read-response-first',
            14: 'rc-read-response-middle', 15: 'rc-read-response-last', 17: 'rc-ack',
            23: 'rc-send-only-invalidate', 100: 'ud-send-only'}
CM_ATTRS = {0x10: 'req', 0x11: 'mra', 0x12: 'rej', 0x13: 'rep', 0x14: 'rtu', 0x15: 'dreq',
            0x16: 'drep'}


def roce_seeds():
    seen_ops, seen_mads, iser_login = set(), set(), []
    for n, _, frame in records(LIO_PCAP):
        got = ipv4(frame)
        if not got or got[0][9] != 17:
            continue
        ip, ihl = got
        if struct.unpack('>H', ip[ihl + 2:ihl + 4])[0] != 4791:
            continue
        roce = ip[ihl + 8:]
        op = roce[0]
        if op not in seen_ops:
            seen_ops.add(op)
            seed('transport_packet', f'eth-{ROCE_OPS[op]}-frame{n}', frame[:14 + len(ip)])
            if op in (4, 12, 17, 100):
                seed('transport_packet', f'ipv4-{ROCE_OPS[op]}-frame{n}', ip)
                seed('transport_packet', f'roce-{ROCE_OPS[op]}-frame{n}', roce)
        if op == 100:
            mad = roce[20:20 + 256]
            attr = struct.unpack('>H', mad[16:18])[0]
            if attr not in seen_mads or attr == 0x10:
                seen_mads.add(attr)
                name = CM_ATTRS.get(attr, f'attr{attr:04x}')
                seed('transport_cm', f'mad-{name}-frame{n}', mad)
                if attr == 0x10:
                    seed('transport_cm', f'cm-req-frame{n}', mad[24:])
                    seed('transport_cm', f'cma-hdr-req-frame{n}', mad[24 + 140:])
                    seed('transport_cm', f'service-id-frame{n}', mad[24 + 8:24 + 16])
        # iSER control PDUs (iSER header 0x10, then the BHS) of Login Requests.
        if op == 4 and len(roce) > 12 + 28 + 48 and roce[12] & 0xf0 == 0x10:
            bhs = roce[40:88]
            if bhs[0] & 0x3f == LOGIN_REQ:
                dlen = int.from_bytes(bhs[5:8], 'big')
                iser_login.append({'bhs': bhs, 'data': roce[88:88 + dlen]})
    if iser_login:
        seed('iscsi_login', 'iser-lio-initiator', b'\x01' + login_records(iser_login))
        seed('iscsi_login', 'iser-lio-initiator-open-target',
             b'\x01' + login_records(retarget(iser_login)))
        for i, p in enumerate(iser_login):
            seed('iscsi_text', f'iser-login-request{i}', p['data'])


# --- iSCSI over TCP ---------------------------------------------------------------------

PARAM_CMDS = {0x5f: 0, 0x42: 1, 0x15: 2, 0x55: 3, 0x83: 4, 0x48: 5}
SETUP_OPS = {0x00, 0x12, 0x25, 0x9e, 0xa0}
SETUP_CDBS = {bytes.fromhex('5e000000000000400000'), bytes.fromhex('a30c800000000000ffff0000'),
              bytes.fromhex('1a003f00ff00')}
MAX_COMMANDS = 8
MAX_DATA_OUT = 4096


seen_logins = set()
seen_opcodes = set()


def responder_seeds():
    """transport_responder: capture datagrams re-addressed to the fuzz device (see
    rtgt_fuzz::transport_responder for the record layout and control bits)."""
    dgrams = []
    for n, _, frame in records(LIO_PCAP):
        got = ipv4(frame)
        if not got or got[0][9] != 17:
            continue
        ip, ihl = got
        if struct.unpack('>H', ip[ihl + 2:ihl + 4])[0] == 4791:
            dgrams.append((n, ip, ip[ihl + 8:]))

    def record(ctrl, ip):
        return bytes([ctrl]) + struct.pack('>H', len(ip)) + ip

    def ctrl_for(roce, psn_pick=0):
        op, dqp = roce[0], int.from_bytes(roce[5:8], 'big')
        target = 1 if op < 0x20 else (3 if dqp == 1 else 2)
        return 1 | target << 1 | 8 | 16 | psn_pick << 6

    seen = set()
    for i, (n, ip, roce) in enumerate(dgrams):
        op = roce[0]
        if op in seen:
            continue
        seen.add(op)
        name = ROCE_OPS[op]
        seed('transport_responder', f'{name}-frame{n}', record(ctrl_for(roce), ip))
        if op < 0x0d or op in (0x13, 0x14, 0x16, 0x17):
            # The whole message, PSNs in sequence, then again as a duplicate.
            msg, dqp = [], roce[5:8]
            for m, ip2, roce2 in dgrams[i:i + 64]:
                if roce2[5:8] != dqp or roce2[0] >= 0x0d and roce2[0] not in (0x16, 0x17):
                    continue
                msg.append(record(ctrl_for(roce2), ip2))
                if ROCE_OPS[roce2[0]].endswith(('last', 'only', 'request', 'invalidate',
                                                'swap', 'add', 'immediate')):
                    break
            seed('transport_responder', f'{name}-message-frame{n}', b''.join(msg))
            seed('transport_responder', f'{name}-duplicate-frame{n}',
                 b''.join(msg) + record(ctrl_for(roce, 2), ip))
            seed('transport_responder', f'{name}-out-of-order-frame{n}',
                 record(ctrl_for(roce, 3), ip) + b''.join(msg))
        elif 0x0d <= op <= 0x12:
            for pick in (1, 2, 3):
                seed('transport_responder', f'{name}-psn{pick}-frame{n}',
                     record(ctrl_for(roce, pick), ip) + record(0x20, b''))
        if op == 100:
            seed('transport_responder', f'{name}-as-is-frame{n}', record(0, ip))
    # A stretch of the capture as it came, retargeted to the RC QP, with the timers running.
    rc = [(ip, roce) for _, ip, roce in dgrams if roce[0] < 0x20][:48]
    seed('transport_responder', 'rc-stream',
         b''.join(record(ctrl_for(roce) | (0x20 if k % 16 == 15 else 0), ip)
                  for k, (ip, roce) in enumerate(rc)))


def session_seeds(path):
    scenario = os.path.basename(path).rsplit('.', 1)[0]
    for i, c in enumerate(iscsi_connections(path)):
        tag = f'{scenario}-conn{i}'
        login = [p for p in c['init'] if p['login']]
        # Connections that add nothing new (the same login texts, no PDU type not seen yet
        # in the same direction with the same digests) are left out.
        texts = tuple(p['data'] for p in login)
        opcodes = {('c2s', c['hd'], c['dd'], p['bhs'][0] & 0x3f) for p in c['init']}
        opcodes |= {('s2c', c['hd'], c['dd'], p['bhs'][0] & 0x3f) for p in c['tgt']}
        if texts in seen_logins and opcodes <= seen_opcodes:
            continue
        seen_opcodes.update(opcodes)
        if texts not in seen_logins:
            seen_logins.add(texts)
            seed('iscsi_login', f'{tag}', b'\x00' + login_records(login))
            if any(k == b'TargetName' and v != OPEN_TARGET and b'chap' not in v
                   for p in login for k, v in text_pairs(p['data'])):
                seed('iscsi_login', f'{tag}-open-target', b'\x00' + login_records(retarget(login)))
        for p in c['init'] + c['tgt']:
            if p['bhs'][0] & 0x3f in (LOGIN_REQ, TEXT_REQ, LOGIN_RSP, TEXT_RSP) and p['data']:
                kind = {LOGIN_REQ: 'login-request', TEXT_REQ: 'text-request',
                        LOGIN_RSP: 'login-response', TEXT_RSP: 'text-response'}
                seed('iscsi_text', f'{tag}-{kind[p["bhs"][0] & 0x3f]}-{p["off"]}', p['data'])
        # Byte streams for the PDU reader: the login phase without digests; the full-feature
        # phase with the digests the connection negotiated. Byte 0: digests and chunk size.
        for direction, pdus, chunk in (('c2s', c['init'], 1), ('s2c', c['tgt'], 16)):
            stream = c[direction]
            ffp = [p for p in pdus if not p['login']]
            if c['hd'] or c['dd']:
                if ffp:
                    flags = (c['hd'] * 1) | (c['dd'] * 2) | (63 << 2)
                    start = ffp[0]['off']
                    end = ffp[-1]['off'] + ffp[-1]['len']
                    seed('iscsi_bhs', f'{tag}-{direction}-digests', bytes([flags]) + stream[start:end])
                login_end = ffp[0]['off'] if ffp else len(stream)
                seed('iscsi_bhs', f'{tag}-{direction}-login', bytes([chunk << 2]) + stream[:login_end])
            else:
                end = pdus[-1]['off'] + pdus[-1]['len'] if pdus else 0
                if end <= 16384:
                    seed('iscsi_bhs', f'{tag}-{direction}', bytes([chunk << 2]) + stream[:end])


def scenario_seeds(path):
    scenario = os.path.basename(path).rsplit('.', 1)[0]
    conns = iscsi_connections(path)
    initiators = []
    for c in conns:
        if c['initiator'] not in initiators:
            initiators.append(c['initiator'])
    cmds = scsi_commands(conns)
    # scsi_cdb: the scenario's own commands as one sequence, without iscsi-test-cu's setup
    # (the first of each SETUP_CDBS per initiator) and the common discovery commands, unless nothing else
    # is left.
    own, skipped = [], set()
    for x in cmds:
        if x[2] in SETUP_CDBS and (x[1], x[2]) not in skipped:
            skipped.add((x[1], x[2]))
        elif x[2][0] not in SETUP_OPS:
            own.append(x)
    picked = own or cmds
    rec = bytearray()
    for _, ini, cdb, edtl, out in picked[:MAX_COMMANDS]:
        out = bytes(out[:MAX_DATA_OUT])
        rec += bytes([len(cdb)]) + struct.pack('<H', min((edtl + 15) // 16, 0xffff))
        rec += bytes([initiators.index(ini)]) + struct.pack('<H', len(out)) + cdb + out
    if rec:
        seed('scsi_cdb', scenario, rec)
    # scsi_params: the parameter list commands the harness builds CDBs for.
    rec = bytearray()
    n = 0
    for _, ini, cdb, edtl, out in cmds:
        if cdb[0] not in PARAM_CMDS or n == MAX_COMMANDS:
            continue
        if cdb[0] == 0x48 and cdb[1] & 0x1f != 0x01:
            continue
        if cdb[0] == 0x5f and cdb[2] & 0xf0:
            continue
        flags = (cdb[1] & 0x07) | ((cdb[2] & 0x0f) << 3) if cdb[0] == 0x5f else 0
        sel = PARAM_CMDS[cdb[0]] | (initiators.index(ini) << 6)
        out = bytes(out[:0xff if cdb[0] == 0x15 else 0xffff])
        rec += bytes([sel, flags]) + struct.pack('<H', len(out)) + out
        n += 1
    if rec:
        seed('scsi_params', scenario, rec)
    # The same EXTENDED COPY, copying to the second logical unit of the harness.
    for _, ini, cdb, edtl, out in cmds:
        if cdb[0] == 0x83 and len(out) == 76 and out[16] == 0xe4 and out[48] == 0x02:
            lu2 = bytearray(out[16:48])
            lu2[8 + 15] = 0x02
            seg = bytearray(out[48:76])
            seg[6:8] = b'\x00\x01'
            data = bytearray(out[:16]) + out[16:48] + lu2 + seg
            data[2:4] = struct.pack('>H', 64)
            seed('scsi_params', f'{scenario}-to-second-lu', bytes([4, 0]) + struct.pack('<H', len(data)) + data)
            break


def main():
    roce_seeds()
    responder_seeds()
    mode = None
    for arg in sys.argv[1:]:
        if arg in ('--sessions', '--scenarios'):
            mode = arg
        elif mode == '--sessions':
            session_seeds(arg)
        elif mode == '--scenarios':
            scenario_seeds(arg)
        else:
            sys.exit(__doc__)
    for target, files in sorted(written.items()):
        print(f'{target}: {len(files)} seeds')


if __name__ == '__main__':
    main()

#!/usr/bin/env python3
"""Decodes a Perfetto protobuf trace with the classes that ship in the
`perfetto` PyPI package (perfetto/protos/perfetto/trace/perfetto_trace_pb2.py,
with the `protobuf` package; no trace processor) and prints, as JSON, what
tests/tests/profile_formats.rs checks: the tracks (uuid, name, parent, pid,
tid) and the slices (track, name, begin, end, args) paired from
SLICE_BEGIN/SLICE_END on each track, plus instants and counters.

Usage: perfetto_summary.py TRACE
"""
import json
import sys

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

trace = pb.Trace()
trace.ParseFromString(open(sys.argv[1], "rb").read())
tracks = {}
open_slices = {}
slices = []
instants = []
counters = []
E = pb.TrackEvent
for p in trace.packet:
    if p.HasField("track_descriptor"):
        d = p.track_descriptor
        t = {"uuid": d.uuid, "name": d.name, "parent": d.parent_uuid if d.HasField("parent_uuid") else None}
        if d.HasField("process"):
            t["pid"] = d.process.pid
            t["process_name"] = d.process.process_name
        if d.HasField("thread"):
            t["pid"] = d.thread.pid
            t["tid"] = d.thread.tid
        t["counter"] = d.HasField("counter")
        tracks[d.uuid] = t
    if p.HasField("track_event"):
        e = p.track_event
        args = {}
        for a in e.debug_annotations:
            for k in ("string_value", "uint_value", "int_value"):
                if a.HasField(k):
                    args[a.name] = getattr(a, k)
        if e.type == E.TYPE_SLICE_BEGIN:
            open_slices.setdefault(e.track_uuid, []).append({"track": e.track_uuid, "name": e.name, "begin": p.timestamp, "args": args})
        elif e.type == E.TYPE_SLICE_END:
            s = open_slices[e.track_uuid].pop()
            s["end"] = p.timestamp
            slices.append(s)
        elif e.type == E.TYPE_INSTANT:
            instants.append({"track": e.track_uuid, "name": e.name, "ts": p.timestamp, "args": args})
        elif e.type == E.TYPE_COUNTER:
            counters.append({"track": e.track_uuid, "ts": p.timestamp, "value": e.double_counter_value})
unclosed = sum(len(v) for v in open_slices.values())
json.dump({"tracks": list(tracks.values()), "slices": slices, "instants": instants, "counters": counters, "unclosed": unclosed}, sys.stdout)

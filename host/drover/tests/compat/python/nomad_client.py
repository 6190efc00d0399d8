"""Drives a Drover dev agent with python-nomad, exactly as a script written for Nomad
does (host/drover/tests/compat/nomad_api.rs runs it): the leader, the nodes, a JSON job
on raw_exec with count 2, its allocations running, one allocation with its task
states, the task's stdout through the client fs logs API (plain and framed), the
evaluations, then the deregistration and the allocations stopping.

Usage: nomad_client.py PORT TOKEN JOB_ID MARKER
Each step prints one line; any failure raises with what was seen."""

import base64
import json
import sys
import time

import nomad

port, token, job_id, marker = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
n = nomad.Nomad(host="127.0.0.1", port=int(port), token=token, timeout=30)


def step(text):
    print(text, flush=True)


def wait(what, fetch, done, limit=60):
    deadline = time.monotonic() + limit
    seen = None
    while time.monotonic() < deadline:
        seen = fetch()
        if done(seen):
            return seen
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {limit}s; last seen: {json.dumps(seen, indent=1)[:4000]}")


leader = n.status.leader.get_leader()
assert isinstance(leader, str) and leader, f"leader: {leader!r}"
step(f"leader {leader}")

nodes = n.nodes.get_nodes()
assert len(nodes) == 1, f"nodes: {nodes}"
node = nodes[0]
assert node["Status"] == "ready", node
assert node["Datacenter"] == "dc1", node
assert node["ID"] and node["Name"], node
step(f"node {node['Name']} {node['ID']} {node['Status']}")

job = {
    "Job": {
        "ID": job_id,
        "Name": job_id,
        "Type": "service",
        "Datacenters": ["dc1"],
        "TaskGroups": [
            {
                "Name": "web",
                "Count": 2,
                "Tasks": [
                    {
                        "Name": "server",
                        "Driver": "raw_exec",
                        "Config": {
                            "command": "/bin/sh",
                            "args": [
                                "-c",
                                f"echo hello from $NOMAD_ALLOC_INDEX of $NOMAD_JOB_NAME; exec sleep {marker}",
                            ],
                        },
                        "Resources": {"CPU": 100, "MemoryMB": 64},
                    }
                ],
            }
        ],
    }
}
registered = n.job.register_job(job_id, job)
assert registered.get("EvalID"), registered
step(f"registered eval {registered['EvalID']}")

got = n.job.get_job(job_id)
assert got["ID"] == job_id and got["TaskGroups"][0]["Count"] == 2, got
assert got["TaskGroups"][0]["Tasks"][0]["Driver"] == "raw_exec", got

allocs = wait(
    "two running allocations",
    lambda: n.job.get_allocations(job_id),
    lambda a: len([x for x in a if x["ClientStatus"] == "running"]) == 2,
)
running = [a for a in allocs if a["ClientStatus"] == "running"]
assert sorted(a["Name"] for a in running) == [f"{job_id}.web[0]", f"{job_id}.web[1]"], running
step("allocations " + " ".join(a["ID"] for a in running))

alloc = n.allocation.get_allocation(running[0]["ID"])
assert alloc["JobID"] == job_id and alloc["TaskGroup"] == "web", alloc
assert alloc["NodeID"] == node["ID"], alloc
state = alloc["TaskStates"]["server"]
assert state["State"] == "running" and state["Failed"] is False, state
assert state["StartedAt"], state
index = alloc["Name"].rsplit("[", 1)[1].rstrip("]")
step(f"allocation {alloc['ID']} index {index} task state {state['State']}")

expected = f"hello from {index} of {job_id}"
text = wait(
    "the task's stdout (plain)",
    lambda: n.client.stream_logs.stream(alloc["ID"], "server", "stdout", plain=True),
    lambda t: expected in t,
)
step(f"plain logs {text.strip()!r}")

framed = n.client.stream_logs.stream(alloc["ID"], "server", "stdout")
decoder = json.JSONDecoder()
data, pos = b"", 0
framed = framed.strip()
while pos < len(framed):
    frame, end = decoder.raw_decode(framed, pos)
    if frame.get("Data"):
        data += base64.b64decode(frame["Data"])
    pos = end
    while pos < len(framed) and framed[pos].isspace():
        pos += 1
assert expected in data.decode(), f"framed logs: {framed[:2000]}"
step("framed logs ok")

evals = n.evaluations.get_evaluations()
mine = [e for e in evals if e["JobID"] == job_id]
assert any(e["ID"] == registered["EvalID"] for e in mine), evals
assert all(e["Status"] in ("complete", "pending", "blocked") for e in mine), mine
step(f"evaluations {len(mine)}")

stopped = n.job.deregister_job(job_id)
assert stopped.get("EvalID"), stopped
step(f"deregistered eval {stopped['EvalID']}")

wait(
    "every allocation stopped",
    lambda: n.job.get_allocations(job_id),
    lambda a: len(a) == 2
    and all(x["DesiredStatus"] == "stop" and x["ClientStatus"] in ("complete", "failed") for x in a),
)
step("stopped")

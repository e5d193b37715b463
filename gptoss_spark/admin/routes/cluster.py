"""This node's half of a two-node engine (docs/CLUSTER.md): GET /admin/cluster, which the other
node's supervisor polls (service/cluster.py), and POST /admin/cluster/order, the head's order."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from ...service.cluster import OrderBody
from ..dependencies import Mutation, SupervisorDep, mutation, supervisor_of
from ..refusal import NO_STORE, Refused, audit

router = APIRouter()


def worker_only(request: Request, action: str) -> None:
    cluster = supervisor_of(request).status().cluster
    role = cluster.node.role if cluster else None
    if role != "worker":
        raise Refused(409, "not_worker", f"only a cluster worker takes orders; this node's role is {role or 'single'}",
                      action=action, outcome="rejected: not a cluster worker")


Order = Annotated[Mutation[OrderBody], Depends(mutation("cluster order", OrderBody, precondition=worker_only))]


@router.get("/admin/cluster")
async def get_cluster(supervisor: SupervisorDep) -> JSONResponse:
    cluster = supervisor.status().cluster
    if cluster is None:
        raise Refused(404, "not_clustered", "this node has no [cluster] setting (docs/CLUSTER.md)")
    return JSONResponse(cluster.node.to_json(), headers=NO_STORE)


@router.post("/admin/cluster/order")
async def cluster_order(request: Request, m: Order, supervisor: SupervisorDep) -> JSONResponse:
    order = m.body
    supervisor.order_from_head(order.generation, order.profile, order.run)
    audit(request, m.action, "accepted", generation=order.generation, target=order.profile, run=order.run)
    after = supervisor.status().cluster
    assert after is not None
    return JSONResponse(after.node.to_json(), headers=NO_STORE)

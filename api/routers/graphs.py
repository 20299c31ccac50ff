"""/v1/graphs: upload a graph once, refer to it by its id afterwards."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body
from fastapi.responses import JSONResponse

from planner.api.deps import AUTH_ERRORS, COMMON_ERRORS, Identity, Parts, error_responses
from planner.api.request_documents import GraphBody
from planner.api.schemas import EXAMPLE_GRAPH, GraphCreated, GraphDocument

router = APIRouter(prefix="/v1")


@router.post(
    "/graphs",
    status_code=201,
    response_model=GraphCreated,
    responses={200: {"model": GraphCreated}, **error_responses(*COMMON_ERRORS, 429)},
    summary="Upload a graph once; refer to it by its id afterwards",
)
def upload_graph(
    parts: Parts,
    who: Identity,
    graph: Annotated[GraphBody, Body(openapi_examples={"small": {"value": EXAMPLE_GRAPH}})],
) -> JSONResponse:
    parts.limiter.check(who)
    parsed = parts.service.parse_graph(graph)
    graph_hash, created = parts.service.put_graph(parsed, who.tenant)
    body = GraphCreated(
        id=graph_hash,
        nodes=len(parsed.nodes),
        edges=len(parsed.edges),
        created=created,
        url=f"/v1/graphs/{graph_hash}",
    )
    return JSONResponse(body.model_dump(), status_code=201 if created else 200)


@router.get(
    "/graphs/{graph_id}",
    response_model=GraphDocument,
    responses=error_responses(*AUTH_ERRORS, 404, 422),
)
def get_graph(parts: Parts, who: Identity, graph_id: str) -> GraphDocument:
    graph = parts.service.stored_graph(graph_id, who.scope)
    return GraphDocument(id=graph_id, graph=graph.model_dump(mode="json"))

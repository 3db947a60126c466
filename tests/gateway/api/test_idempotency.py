

def test_the_openapi_document_names_the_key_on_every_post_and_delete() -> None:
    doc = create_app(Settings()).openapi()
    mutating = [(m, p, op) for p, ops in doc["paths"].items() for m, op in ops.items()
                if m in ("post", "delete") and p.startswith("/v1/") and "security" in op]
    assert len(mutating) > 30
    missing = [f"{m.upper()} {p}" for m, p, op in mutating
               if not any(q["in"] == "header" and q["name"] == "Idempotency-Key" for q in op.get("parameters", []))
               or not {"409", "422"} <= set(op["responses"])]
    assert not missing, missing
    reads = [op for ops in doc["paths"].values() for m, op in ops.items() if m == "get"]
    assert not any(q["name"] == "Idempotency-Key" for op in reads for q in op.get("parameters", []))

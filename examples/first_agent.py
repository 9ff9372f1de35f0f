"""A first agent: a model call, a tool, a person's approval, memory across two events."""

import json

from beam_agents import ScriptedLlmClient, agent, run_locally


@agent(name="first_agent/v1")
def shop(ctx, event: bytes) -> bytes:
    orders = int(ctx.memory.get("orders", b"0"))  # remembered across events
    reply = ctx.llm([{"role": "user", "content": event.decode()}], model="shop-model")
    item = reply.text
    stock = ctx.call_tool("stock.lookup", {"item": item})  # suspends until answered
    if not stock.ok or stock.payload_unknown:  # failed, or took effect with no answer
        return json.dumps({"item": item, "outcome": "stock unknown"}).encode()
    if json.loads(stock.payload)["in_stock"] == 0:
        return json.dumps({"item": item, "outcome": "out of stock"}).encode()
    if not ctx.request_approval(f"Order one {item}?", item=item).ok:
        return json.dumps({"item": item, "outcome": "declined"}).encode()
    ctx.memory.put("orders", str(orders + 1).encode())
    return json.dumps({"item": item, "outcome": "ordered", "orders": orders + 1}).encode()


def stock_lookup(args: dict, intent) -> bytes:
    return json.dumps({"item": args["item"], "in_stock": 3}).encode()


def model(request) -> str:  # a scripted model: the last word of the request
    return request.messages[-1]["content"].split()[-1]


if __name__ == "__main__":
    run = run_locally(
        shop,
        [b"I need a pen", b"and a notebook"],
        tools={"stock.lookup": stock_lookup},
        approver=lambda intent: True,  # a person at the console says yes
        llm_client=ScriptedLlmClient(model),
    )
    print(run.transcript())

"""Realistic domain-event payloads of about 1 KB, generated deterministically.

An `order.placed` event as a shop would publish it: identifiers, a customer
block, a shipping address, order lines, totals and timestamps. Values vary per
message (random from a seeded generator), so the JSON has the entropy of real
events rather than repeated filler that compresses to nothing. The data is
synthetic: names and addresses are drawn from small fixed word lists.
"""

from __future__ import annotations

import random
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator

STREAMS = ("bench.orders", "bench.payments", "bench.shipments", "bench.customers")

_FIRST = ("Ada", "Grace", "Linus", "Barbara", "Ken", "Margaret", "Dennis", "Frances", "Edsger", "Radia")
_LAST = ("Lovelace", "Hopper", "Torvalds", "Liskov", "Thompson", "Hamilton", "Ritchie", "Allen", "Dijkstra",
         "Perlman")
_STREETS = ("Harbour Road", "Mill Lane", "Station Street", "Church Walk", "Market Square", "Kings Avenue")
_CITIES = (("Dublin", "IE"), ("Lisbon", "PT"), ("Tallinn", "EE"), ("Utrecht", "NL"), ("Graz", "AT"),
           ("Leeds", "GB"), ("Porto", "PT"), ("Lyon", "FR"))
_PRODUCTS = ("Ceramic mug", "Walnut desk organiser", "Linen tea towel", "Enamel camping plate",
             "Wool beanie", "Recycled notebook A5", "Cast iron skillet 26 cm", "Bamboo cutting board",
             "Stainless water bottle 750 ml", "Canvas tote bag")
_CHANNELS = ("web", "ios", "android", "pos")
_BASE_TIME = datetime(2026, 1, 1, tzinfo=timezone.utc)


def order_placed(rng: random.Random, i: int) -> dict[str, Any]:
    """One `order.placed` payload (about 1 KB as compact JSON)."""
    first, last = rng.choice(_FIRST), rng.choice(_LAST)
    city, country = rng.choice(_CITIES)
    placed = _BASE_TIME + timedelta(seconds=rng.randrange(0, 365 * 86400), microseconds=rng.randrange(10**6))
    lines = []
    subtotal = 0
    for n in range(rng.randint(2, 5)):
        qty = rng.randint(1, 5)
        price = rng.randrange(299, 12999)
        subtotal += qty * price
        lines.append({
            "line": n + 1,
            "sku": f"SKU-{rng.randrange(10**6):06d}",
            "name": rng.choice(_PRODUCTS),
            "quantity": qty,
            "unit_price_cents": price,
            "tax_rate": rng.choice((0.0, 0.09, 0.21, 0.23)),
        })
    shipping = rng.choice((0, 495, 695))
    return {
        "order_id": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        "order_number": f"SO-{2026}{i:08d}",
        "placed_at": placed.isoformat().replace("+00:00", "Z"),
        "channel": rng.choice(_CHANNELS),
        "customer": {
            "customer_id": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
            "name": f"{first} {last}",
            "segment": rng.choice(("new", "returning", "vip")),
        },
        "shipping_address": {
            "line1": f"{rng.randint(1, 240)} {rng.choice(_STREETS)}",
            "city": city,
            "postcode": f"{rng.randrange(10**4, 10**5)}",
            "country": country,
        },
        "lines": lines,
        "totals": {
            "currency": "EUR",
            "subtotal_cents": subtotal,
            "shipping_cents": shipping,
            "total_cents": subtotal + shipping,
        },
        "payment": {"method": rng.choice(("card", "paypal", "sepa")), "authorisation": f"{rng.getrandbits(48):012x}"},
        "trace": {"correlation_id": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                  "source": "checkout-service", "schema_version": 3},
    }


def events(n: int, *, seed: int = 6, streams: tuple[str, ...] = STREAMS[:1],
           prefix: str = "bench.", keys: int | None = None) -> Iterator[dict[str, Any]]:
    """`n` keyword-argument mappings for `producer.enqueue_events_bulk`.

    Streams are taken round-robin from `streams`, renamed under `prefix` so a
    benchmark never writes outside its own key space. Without `keys` the
    events carry no ordering key; with it, each takes one of `keys` distinct
    keys at random (from its own seeded generator, so the payloads are the
    same either way).
    """
    rng = random.Random(seed)
    key_rng = random.Random(seed + 1)
    names = [prefix + s.removeprefix("bench.") for s in streams]
    for i in range(n):
        payload = order_placed(rng, i)
        yield {
            "stream": names[i % len(names)],
            "type": "order.placed",
            "key": None if keys is None else f"order-{key_rng.randrange(keys)}",
            "payload": payload,
        }

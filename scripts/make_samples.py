"""Regenerate sts_harness/samples/support_tickets.jsonl (deterministic, 300 tickets)."""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "sts_harness" / "samples" / "support_tickets.jsonl"

HIGH = [
    "My card was charged {n} times for order #{o}; please refund the extra charges.",
    "Someone changed the email on my account without my permission.",
    "I see a payment of {amt} EUR I never made, order #{o}.",
    "The checkout takes my money but shows an error, order #{o}.",
    "My account is locked and I have a delivery arriving today.",
]
NORMAL = [
    "Order #{o} has not arrived after {n} days. Where is it?",
    "Can I change the delivery address of order #{o}?",
    "The tracking link for order #{o} does not work.",
    "I received the wrong size for order #{o}. How do I exchange it?",
    "The {item} I bought stopped working after {n} days.",
    "How do I return the {item} from order #{o}?",
    "Password reset emails never arrive in my inbox.",
]
LOW = [
    "Do you ship to {country}?",
    "Can I get an invoice with my company's VAT number for order #{o}?",
    "Is the {item} available in another colour?",
    "How long does the warranty on the {item} last?",
    "Do you have a student discount?",
    "Can I pay for order #{o} in {n} instalments?",
]
ITEMS = ["headphones", "kettle", "backpack", "phone case", "desk lamp", "running shoes"]
COUNTRIES = ["Norway", "Portugal", "Canada", "Japan", "Chile"]


def main() -> None:
    rng = random.Random(42)
    rows = []
    for i in range(300):
        priority = rng.choices(["high", "normal", "low"], weights=[2, 5, 3])[0]
        pool = {"high": HIGH, "normal": NORMAL, "low": LOW}[priority]
        text = rng.choice(pool).format(n=rng.randint(2, 9), o=rng.randint(10000, 99999),
                                       amt=rng.randint(20, 900), item=rng.choice(ITEMS),
                                       country=rng.choice(COUNTRIES))
        rows.append({"ticket_id": f"T{i:04d}", "text": text, "priority": priority})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    print(OUT, len(rows))


if __name__ == "__main__":
    main()

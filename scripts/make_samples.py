"""Regenerate the sample tickets (deterministic): sts_harness/samples/support_tickets.jsonl
(300 tickets, the demo's stream, each from one of 60 customers), l1_labelled.jsonl (those
tickets labelled ``route = llm`` plus greetings and thanks (``rule``) and spam
(``drop``), to train L1 with ``sts l1 train``) and customers.jsonl (the customers'
features: ``tier``, ``open_tickets``; the demo writes them into a Delta feature table)."""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "sts_harness" / "samples" / "support_tickets.jsonl"
LABELLED = OUT.with_name("l1_labelled.jsonl")
CUSTOMERS = OUT.with_name("customers.jsonl")
#: Customers and their tiers (weights: a few enterprise customers, most on the free tier).
N_CUSTOMERS = 60
TIERS = {"enterprise": 1, "business": 3, "free": 6}

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
# Answered at once by a rule template (no LLM): greetings and thanks.
RULE = [
    "{hi}", "{hi}!", "{hi}, is anyone there?", "{hi}, I have a question.", "{hi} team, good {tod}.",
    "{thanks}", "{thanks}!", "{thanks}, that solved it.", "{thanks} for the quick reply.",
    "Great, {thanks_l}!", "Ok, {thanks_l}. Have a nice day.", "Perfect, problem solved, {thanks_l}.",
    "Good {tod}!", "Bye, {thanks_l}!",
]
HI = ["Hi", "Hello", "Hey", "Hi there", "Good day", "Greetings"]
THANKS = ["Thanks", "Thank you", "Many thanks", "Thanks a lot", "Thank you so much"]
TOD = ["morning", "afternoon", "evening"]
# Dropped: spam and nonsense.
DROP = [
    "WIN a FREE {prize} now!!! Click {url}",
    "Cheap {goods} at the best price, visit {url}",
    "Earn {amt} EUR a day from home, no experience needed: {url}",
    "Congratulations, you were selected for a {prize}. Claim it at {url}",
    "Buy followers and likes, {amt} for 1 EUR: {url}",
    "Crypto investment with {n}00% return guaranteed, join {url}",
    "asdf qwerty {n}{n}{n}",
    "SEO services for your shop, first page of search in {n} days. Contact {url}",
]
PRIZES = ["iPhone", "gift card", "cruise", "laptop", "car"]
GOODS = ["watches", "sunglasses", "pills", "designer bags"]
URLS = ["http://bit.ly/x{n}", "www.win-big{n}.biz", "http://cheap-deals{n}.ru", "promo{n}.xyz"]


def labelled_rows(tickets: list[dict]) -> list[dict]:
    """The tickets labelled ``llm`` plus 120 ``rule`` and 80 ``drop`` examples."""
    rng = random.Random(7)
    rows = [{"text": t["text"], "priority": t["priority"], "route": "llm"} for t in tickets]
    for route, pool, count in (("rule", RULE, 120), ("drop", DROP, 80)):
        for _ in range(count):
            n = rng.randint(2, 9)
            text = rng.choice(pool).format(
                hi=rng.choice(HI), thanks=rng.choice(THANKS),
                thanks_l=rng.choice(THANKS).lower(), tod=rng.choice(TOD),
                prize=rng.choice(PRIZES), goods=rng.choice(GOODS),
                url=rng.choice(URLS).format(n=n), amt=rng.randint(100, 900), n=n)
            rows.append({"text": text, "priority": "low", "route": route})
    rng.shuffle(rows)
    return rows


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
    # Customers from their own generator, so the ticket texts above stay as they were.
    crng = random.Random(11)
    customers = [{"customer_id": f"C{i:03d}",
                  "tier": crng.choices(list(TIERS), weights=list(TIERS.values()))[0],
                  "open_tickets": crng.choice([0, 0, 0, 1, 1, 2, 3, 5])}
                 for i in range(N_CUSTOMERS)]
    for r in rows:
        r["customer_id"] = crng.choice(customers)["customer_id"]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    print(OUT, len(rows))
    labelled = labelled_rows(rows)
    LABELLED.write_text("".join(json.dumps(r) + "\n" for r in labelled), encoding="utf-8")
    print(LABELLED, len(labelled))
    CUSTOMERS.write_text("".join(json.dumps(c) + "\n" for c in customers), encoding="utf-8")
    print(CUSTOMERS, len(customers))


if __name__ == "__main__":
    main()

"""Deterministic generator of the example pipeline's call-center transcripts.

Run ``python assets/data/generate_transcripts.py`` to rewrite ``call_center_transcripts.csv.gz``.
Generation uses only a seeded ``random.Random``; pandas only writes the gzip CSV (with gzip
``mtime=0`` so the bytes are reproducible too).

Besides the raw columns the file carries ``expected_risk_level`` and
``expected_action_required``: the labels the generator *intended* for each call (mood -> risk:
angry=High, upset=Medium, calm=Low; topic -> action).  They let tests measure a classifier's
agreement.  Rows whose transcript is null or blank carry null labels (nothing was intended).

Blank transcripts are stored as a single space: a CSV cannot keep ``""`` apart from null once
pandas reads it back, and a whitespace-only transcript is the realistic form of an empty call.
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
from pathlib import Path

OUTPUT = Path(__file__).with_name("call_center_transcripts.csv.gz")
SEED = 20261101
N_CALLS = 720
FIRST_DAY = dt.date(2026, 11, 1)
N_DAYS = 10

AGENTS = ["Maria Lopez", "James Carter", "Aisha Khan", "Tom Becker", "Priya Nair", "Daniel Kim",
          "Sofia Rossi", "Marcus Reed", "Elena Petrova", "Kevin O'Brien", "Grace Liu",
          "Omar Haddad"]
CUSTOMER_NAMES = ["John Miller", "Linda Park", "Robert Nguyen", "Karen Walsh", "Michael Scott",
                  "Jessica Alba Ruiz", "David Cohen", "Emily Stone", "Chris Fontaine",
                  "Patricia Moe", "Brian Oduya", "Nancy Kowalski", "Steven Yu", "Rachel Green",
                  "Carlos Mendes"]
PRODUCTS = ["blender", "air fryer", "coffee maker", "standing desk", "vacuum cleaner", "router",
            "office chair", "space heater", "bluetooth speaker", "rice cooker", "smart thermostat",
            "toaster oven", "electric kettle", "desk lamp", "humidifier", "laptop stand"]
DEFECTS = ["arrived cracked", "stopped working after two days", "won't turn on",
           "was missing parts", "smells like burning plastic", "came in the wrong color",
           "is making a grinding noise",
           "arrived completely smashed", "keeps shutting off", "was clearly used"]
CITIES = ["Springfield", "Riverside", "Fairview", "Madison", "Georgetown", "Clinton", "Salem"]
STREETS = ["Oak St", "Maple Ave", "Pine Rd", "Cedar Ln", "Elm St", "Lakeview Dr", "Hillcrest Blvd"]
COMPAT = ["my iPhone 12", "a Mac", "Alexa", "Google Home", "the older model", "Windows 11"]
COMPANY = ["Northwind Home", "Northwind", "northwind home goods"]
FILLERS = ["um", "uh", "like", "you know", "so", "okay so", "I mean", "right"]
NOISE = ["[inaudible]", "(hold music)", "[crosstalk]", "...", "--", "(sighs)", "[static]"]

GREETINGS = [
    "Thank you for calling {company}, this is {agent_first}. How can I help you today?",
    "{company} customer care, {agent_first} speaking. What can I do for you?",
    "Hi, you've reached {company} support, my name is {agent_first}. How may I help?",
    "Good {daypart}, thanks for holding. This is {agent_first} with {company}, how can I assist?",
    "hello thank u for calling {company} this is {agent_first}",
    "Thanks for calling {company}! {agent_first} here, what's going on today?",
    "{company}, {agent_first} speaking, sorry about the wait. How can I help?",
]
VERIFY = [  # (agent asks, customer answers)
    ("Can I get your order number please?", "Sure, it's {order}."),
    ("Let me pull that up. What's the order number?", "Order {order}, placed on {date}."),
    ("Could you verify the phone number on the account?", "It's {phone}."),
    ("Sure, can I have the email address on file?", "It should be {email}, or maybe my work one"),
    ("Okay, and who am I speaking with?", "This is {customer}, phone number {phone}."),
    ("Can you confirm the last four digits of the card?", "uh, {last4}"),
    ("And what's the best number to reach you?", "my cell, {phone}"),
    ("Could I get your name and email?", "Yeah, my name is {customer}, email {email}."),
]
ACKNOWLEDGE = ["Thanks, I've got your account up.", "Okay, I see it here.", "Got it, one sec.",
               "Perfect, thank you.", "Alright, bear with me."]

OPENERS = {
    "refund": [
        "Hi, I bought a {product} on {date} and it {defect}. I'd like a refund.",
        "yeah hi, I need to return the {product} from order {order} and get my money back",
        "I was charged {amount} for a {product} that never arrived and I want that refunded.",
        "I'm calling about order {order}. The {product} {defect}, can I get a refund please?",
        "I was double charged {amount} on {date} and I need one of those charges reimbursed.",
        "I cancelled my subscription last month but you still charged me {amount}. I want a "
        "refund.",
        "Hello, the {product} I got {defect} so I'd like to send it back for a full refund.",
        "I returned a {product} on {date} and I still haven't received my refund of {amount}.",
        "hi so my {product} {defect}, and I'd like my {amount} back please",
        "I'm requesting a refund for order {order}, the {product} {defect}.",
    ],
    "complaint": [
        "I want to make a complaint about the delivery driver who left my {product} in the rain.",
        "I'm calling to complain about your customer service, honestly.",
        "Your technician was supposed to come on {date} between 9 and 12 and never showed up.",
        "I've been on hold for {minutes} minutes, this is unacceptable.",
        "The person I spoke with yesterday was incredibly rude to me.",
        "I'd like to file a formal complaint about how my order {order} was handled.",
        "My package has been 'out for delivery' for {days} days and nobody can tell me anything.",
        "The {product} you sent is the wrong model AGAIN, second time this month.",
        "I was promised a call back on {date} and never got one, this is terrible service.",
        "Your store in {city} refused to honor the online price and the manager was dismissive.",
    ],
    # Inquiries are (question, answer) pairs so the agent answers what was asked.
    "inquiry": [
        ("Hi, what time does your {city} store close on Saturdays?",
         "Our {city} store is open 9am to 9pm Monday through Saturday and 10 to 6 on Sunday."),
        ("I'm just calling to check on the status of order {order}.",
         "I see order {order} shipped on {date}, tracking number {tracking}."),
        ("I moved recently and need to update my shipping address to {address}.",
         "I've updated the address on file to {address}, future orders will go there."),
        ("Quick question, does the {product} come with a warranty?",
         "Yes, it comes with a 2-year manufacturer warranty, just keep the receipt."),
        ("Is the {product} compatible with {compat}?",
         "Yes, that works with {compat}, you just need the free app."),
        ("Hi, I'd like to know when order {order} will ship.",
         "It's packed and scheduled to ship tomorrow, you'll get an email with tracking."),
        ("Can I change the delivery date for order {order} to {date}?",
         "Done, I've moved the delivery for order {order} to {date}."),
        ("How do I reset my password for the app? It keeps saying invalid login.",
         "You can reset it from the login page, I've also sent a link to {email}."),
        ("Do you price match if I find the {product} cheaper somewhere else?",
         "We do price match local competitors, just bring the ad to the store."),
        ("What is your return policy for opened items?",
         "Opened items can be returned within 30 days with the receipt."),
        ("Hi, are you open on Thanksgiving? And what are the hours on {date}?",
         "We're closed on Thanksgiving, and on {date} we're open 8 to 8."),
        ("I want to add a second {product} to my order {order} before it ships, is that possible?",
         "Yes, I've added it, the new total is {amount}."),
        ("Do you have the {product} in stock at the {city} location?",
         "The {city} store shows 4 in stock, you can reserve one online."),
    ],
}
# Inquiries that merely *mention* a refund: intended General Inquiry, a realistic trap.
REFUND_POLICY_QUESTION = (
    "How long do refunds usually take to show up on a credit card?",
    "Usually 5 to 7 business days after we process it, depending on your bank.",
)

MOOD_LINES = {
    "angry": [
        "This is the third time I've called about this and I am honestly furious.",
        "I am so angry right now, nobody at your company seems to care.",
        "If this isn't fixed today I'm cancelling my account, period.",
        "I'm beyond mad. I've been a loyal customer for {years} years!!",
        "Do you know how angry this makes me? I paid {amount} for this.",
        "I'm livid. I've been waiting {days} days and I'm done waiting.",
        "Honestly I'm ready to call my lawyer over this.",
        "I'm so pissed off I can't even explain it.",
        "You people are unbelievable, I'm absolutely furious.",
        "I'm going to cancel my membership and tell everyone I know to avoid you.",
        "This is outrageous. I'm reporting you to the Better Business Bureau.",
        "I'm SO angry, I took a day off work for this.",
        "I'm fuming, seriously, this is a joke.",
        "I have had it with you people, I want to speak to your supervisor.",
        # Anger without a single emotion word: the hard cases for a lexicon.
        "Are you KIDDING me right now?",
        "Unbelievable. Absolutely unbelievable.",
        "This is a complete joke and you know it.",
        "Get this sorted today or I'm done with your company for good.",
    ],
    "upset": [
        "I'm really disappointed, I was looking forward to this.",
        "Honestly I'm pretty upset about it, it was a gift for my daughter.",
        "It's frustrating because I already sent the photos twice.",
        "I'm not happy about having to call again.",
        "This is kind of annoying, to be honest.",
        "I'm a little upset, I paid extra for express shipping.",
        "I'm frustrated, I've spent my whole lunch break on this.",
        "It's disappointing, I expected better from {company}.",
        "I'm upset because nobody called me back like they promised.",
        "honestly im a bit frustrated with the whole thing",
        "I'm kind of annoyed that I have to explain this again.",
        "Honestly, this isn't what I expected at all.",
        "I'm a bit let down, to be honest.",
        "Sigh. I was hoping this would be easier.",
    ],
    "calm": [
        "No big deal, these things happen.",
        "I'm not upset or anything, just want to sort it out.",
        "No rush at all, I was just curious.",
        "Perfect, that's really helpful.",
        "Okay cool, let me write that down.",
        "Sure, no problem, I can wait.",
        "That's fine, I appreciate you checking.",
        "Great, thanks for explaining.",
    ],
}
EMPATHY = {
    "angry": ["I completely understand, and I sincerely apologize.",
              "I hear you, and I'm very sorry this has happened again.",
              "I understand you're angry and I want to fix this for you right now."],
    "upset": ["I'm sorry about the trouble, let's get this sorted out.",
              "I understand, that's not the experience we want you to have.",
              "I'm sorry to hear that, I'll do my best to help."],
    "calm": ["Of course, happy to help with that.", "Sure thing, let me take a look.",
             "No problem at all, one moment."],
}
RESOLUTION = {
    "refund": [
        "I've processed a refund of {amount} to your card ending in {last4}, it should show in 5-7 "
        "business days.",
        "I'll email you a return label, and once the {product} is scanned the refund goes through.",
        "I see the charge from {date}. I've submitted the reimbursement, reference {ref}.",
        "I've approved the full refund of {amount}, you'll get a confirmation at {email}.",
    ],
    "complaint": [
        "I've documented your complaint and escalated it to my supervisor, reference {ref}.",
        "I've logged this as a formal complaint, you'll hear back within 48 hours.",
        "I'll pass this feedback to the {city} store manager personally.",
        "I'm putting a note on your account and flagging this for our quality team, ref {ref}.",
        "I can offer a {amount} store credit for the trouble while we look into it.",
    ],
}
CLOSE_CUSTOMER = {
    "angry": ["No. Just fix it.", "I'm not holding my breath.", "Whatever. Bye.",
              "We'll see. I'm not calling again."],
    "upset": ["No, just please make sure it actually happens this time.", "Okay. Thanks I guess.",
              "No that's all, hopefully it works out."],
    "calm": ["No that's it, thanks so much!", "Nope, you've been great, thank you.",
             "that's all thx, have a good one", "All set, appreciate it!"],
}
CLOSE_AGENT = ["Thank you for calling {company}, have a great day.", "Take care, goodbye.",
               "Thanks for your patience, bye now.", "Have a good {daypart}."]
RAMBLE = [
    "So the thing is, my neighbor ordered the same {product} and hers works fine, which is weird.",
    "Sorry, my dog is barking, hold on one second. Okay I'm back.",
    "Let me put you on a brief hold while I check with my team.",
    "Thanks for waiting. I'm still looking, the system is a little slow today.",
    "I also wanted to mention I'm moving next month, to {address}, but that's not urgent.",
    "My sister said I should call instead of using the chat, the chat bot just loops.",
    "Can you spell the email back to me? Okay, {email}, yes that's right.",
    "I'm reading the notes from the last call on {date}, give me a moment.",
    "Per our policy items must be in the original packaging, but I'll make an exception note.",
    "Is this the same number I called last week? I think I talked to someone named {other_agent}.",
    "Sorry, you're breaking up a little. Can you repeat the last part?",
    "I wrote everything down on a sticky note, hold on, where did I put it.",
    "Okay, I'm just confirming the account details: {customer}, {phone}, {address}.",
    "The weather here has been crazy, the delivery guys must be swamped.",
]
SPEAKERS = [("Agent", "Customer"), ("AGENT", "CUSTOMER"), ("Rep", "Caller"), ("agent", "customer"),
            ("Agent", "Cust")]


def _typos(text: str, rng: random.Random, rate: float) -> str:
    """Mangle a few words the way fast typists and speech-to-text do."""
    words = text.split(" ")
    for i, word in enumerate(words):
        if len(word) < 4 or rng.random() > rate:
            continue
        k = rng.randrange(1, len(word) - 1)
        kind = rng.randrange(3)
        if kind == 0:
            words[i] = word[:k - 1] + word[k] + word[k - 1] + word[k + 1:]
        elif kind == 1:
            words[i] = word[:k] + word[k + 1:]
        else:
            words[i] = word[:k] + word[k] + word[k:]
    text = " ".join(words)
    if rng.random() < 0.3:
        text = text.replace("'", "")
    if rng.random() < 0.3:
        text = text[:1].lower() + text[1:]
    return text


def _slots(rng: random.Random, agent: str) -> dict[str, str]:
    """Per-call details: the digits, amounts and names that make transcripts messy."""
    customer = rng.choice(CUSTOMER_NAMES)
    first, last = customer.split(" ")[0], customer.split(" ")[-1]
    month_day = rng.randint(1, 28)
    return {
        "agent_first": agent.split(" ")[0],
        "other_agent": rng.choice(AGENTS).split(" ")[0],
        "company": rng.choice(COMPANY),
        "customer": customer,
        "product": rng.choice(PRODUCTS),
        "defect": rng.choice(DEFECTS),
        "order": rng.choice(["#", "", "A-", "NW"]) + str(rng.randint(100000, 999999)),
        "amount": f"${rng.randint(9, 499)}.{rng.choice(['99', '95', '00', '49'])}",
        "date": rng.choice([f"10/{month_day}", f"October {month_day}", f"Oct {month_day}th",
                            f"11/{min(month_day, 9)}/2026"]),
        "phone": f"({rng.randint(201, 989)}) {rng.randint(200, 999)}-{rng.randint(1000, 9999)}",
        "email": f"{first.lower()}.{last.lower()}{rng.randint(1, 99)}@example.com",
        "last4": str(rng.randint(1000, 9999)),
        "ref": f"REF{rng.randint(10000, 99999)}",
        "tracking": f"1Z{rng.randint(10**9, 10**10 - 1)}",
        "city": rng.choice(CITIES),
        "address": f"{rng.randint(10, 9999)} {rng.choice(STREETS)}, {rng.choice(CITIES)}",
        "compat": rng.choice(COMPAT),
        "days": str(rng.randint(3, 21)),
        "minutes": str(rng.randint(20, 90)),
        "years": str(rng.randint(2, 15)),
        "daypart": rng.choice(["morning", "afternoon"]),
    }


def _dialogue(rng: random.Random, topic: str, mood: str, slots: dict, long: bool) -> str:
    """One call as speaker-tagged turns, wording drawn from the pools above."""
    agent_tag, cust_tag = rng.choice(SPEAKERS)
    turns: list[tuple[str, str]] = [("a", rng.choice(GREETINGS))]
    opener = rng.choice(OPENERS[topic])
    if topic == "inquiry" and rng.random() < 0.04:
        opener = REFUND_POLICY_QUESTION
    if topic == "inquiry":
        opener, answer = opener
    else:
        answer = rng.choice(RESOLUTION[topic])
    ask, give = rng.choice(VERIFY)
    turns += [("c", opener), ("a", ask), ("c", give), ("a", rng.choice(ACKNOWLEDGE))]
    mood_lines = rng.sample(MOOD_LINES[mood], k=2 if mood != "calm" else 1)
    turns.append(("c", mood_lines[0]))
    turns.append(("a", rng.choice(EMPATHY[mood])))
    if topic == "complaint" and rng.random() < 0.15:
        turns.append(("c", "And I don't want a refund, I want someone to actually fix it."))
    turns.extend(("c", line) for line in mood_lines[1:])
    turns.append(("a", answer))
    turns.append(("a", "Is there anything else I can help you with?"))
    turns.append(("c", rng.choice(CLOSE_CUSTOMER[mood])))
    turns.append(("a", rng.choice(CLOSE_AGENT)))

    if long:
        # Rambling goes between the opening and the goodbye, burying the signal mid-call.
        target = rng.randint(3300, 7700)
        while sum(len(line) + 12 for _, line in turns) < target:
            turns.insert(rng.randint(4, len(turns) - 3), (rng.choice("ac"), rng.choice(RAMBLE)))

    lines = []
    for who, line in turns:
        line = line.format(**slots)
        if who == "c":
            if rng.random() < 0.25:
                line = f"{rng.choice(FILLERS)}, {line}"
            line = _typos(line, rng, rate=0.02)
        if rng.random() < 0.05:
            line = f"{line} {rng.choice(NOISE)}"
        lines.append(f"{agent_tag if who == 'a' else cust_tag}: {line}")
    if rng.random() < 0.15:
        header = rng.choice(["[call start]", "Call recording begins.", "--- transcript ---"])
        lines.insert(0, header)
    separator = "\n" if rng.random() < 0.7 else " "
    return separator.join(lines)


def _timestamps(rng: random.Random) -> list[dt.datetime]:
    """Call start times over business hours, thinner on the weekend."""
    days = [FIRST_DAY + dt.timedelta(days=i) for i in range(N_DAYS)]
    weights = [0.6 if d.weekday() >= 5 else 1.0 for d in days]
    picked = rng.choices(days, weights=weights, k=N_CALLS)
    stamps = []
    for day in picked:
        seconds = int(rng.triangular(8 * 3600, 18 * 3600, 12.5 * 3600))
        stamps.append(dt.datetime.combine(day, dt.time()) + dt.timedelta(seconds=seconds))
    return sorted(stamps)


def generate(seed: int = SEED) -> list[dict]:
    """The whole dataset as row dicts, identical for identical seeds."""
    rng = random.Random(seed)
    customers = [f"CUST-{rng.randint(10000, 99999)}" for _ in range(420)]
    # Exact shares of null (1%), blank (1%) and long rambling (2%) calls, at seeded positions.
    n_odd = round(N_CALLS * 0.01)
    shapes = ["null"] * n_odd + ["blank"] * n_odd + ["long"] * (2 * n_odd)
    shapes += ["normal"] * (N_CALLS - len(shapes))
    rng.shuffle(shapes)
    rows = []
    for i, (stamp, shape) in enumerate(zip(_timestamps(rng), shapes, strict=True), start=1):
        agent = rng.choice(AGENTS)
        topic = rng.choices(["refund", "complaint", "inquiry"], weights=[35, 25, 40])[0]
        mood_weights = {"refund": [30, 35, 35], "complaint": [50, 50, 0], "inquiry": [0, 8, 92]}
        mood = rng.choices(["angry", "upset", "calm"], weights=mood_weights[topic])[0]
        text: str | None = {"null": None, "blank": " "}.get(shape)
        if shape in ("normal", "long"):
            text = _dialogue(rng, topic, mood, _slots(rng, agent), long=shape == "long")
        blank = text is None or not text.strip()
        rows.append({
            "call_id": f"CALL-{i:06d}",
            "call_timestamp": stamp.isoformat(),
            "agent": agent,
            "customer_id": rng.choice(customers),
            "transcript_raw_text": text,
            "expected_risk_level": None if blank else
            {"angry": "High", "upset": "Medium", "calm": "Low"}[mood],
            "expected_action_required": None if blank else
            {"refund": "Refund Request", "complaint": "Complaint",
             "inquiry": "General Inquiry"}[topic],
        })
    return rows


def write(path: Path = OUTPUT, seed: int = SEED) -> Path:
    """Write the gzip CSV; mtime=0 keeps the compressed bytes reproducible."""
    import pandas as pd

    frame = pd.DataFrame(generate(seed))
    frame.to_csv(path, index=False, compression={"method": "gzip", "mtime": 0})
    return path


def load(path: Path = OUTPUT):
    """Read the dataset back as a pandas DataFrame (null transcripts are NaN)."""
    import pandas as pd

    return pd.read_csv(path, compression="gzip")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUTPUT)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    out = write(args.out, args.seed)
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()

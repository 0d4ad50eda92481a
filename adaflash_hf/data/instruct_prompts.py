"""General assistant requests for the datastore of a chat target, shipped as ``instruct_prompts.jsonl`` beside
this file.

    python -m adaflash_hf.data.instruct_prompts [--count 2000] [--seed 0]   # rewrites the shipped file
    load_instruct_prompts()   # the shipped requests as a prompt dataset ({prompt, domain="instruct"})

The training prompts of code, math and chat (`adaflash_hf.data.load_prompts`) hold only about 70 chat
requests (MT-Bench's train split), so a datastore of the target's own answers to them knows its code and
math style but little of how it writes emails, tips, explanations or stories: the shapes of most chat
traffic. These requests stand in for a deployment's logged traffic (`adaflash generate-data --prompts`
takes a real log the same way): request templates of the kinds chat benchmarks cover (writing, role play,
advice, explanation, comparison, extraction, summary), filled with subjects from a list below and with the
titles and passages of the Wikipedia articles in the training split (`load_prompts("wiki", "train")`), so no
evaluation prompt or evaluation document of any domain is used. Deterministic for a seed.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
from pathlib import Path

logger = logging.getLogger(__name__)
INSTRUCT_PROMPTS_FILE = Path(__file__).with_name("instruct_prompts.jsonl")

SUBJECTS = (
    "remote work",
    "renewable energy",
    "public libraries",
    "electric cars",
    "urban gardening",
    "social media",
    "online privacy",
    "space exploration",
    "climate change",
    "artificial intelligence",
    "healthy sleep",
    "volunteering",
    "learning a second language",
    "city parks",
    "public transport",
    "small businesses",
    "video games",
    "classical music",
    "street food",
    "recycling",
    "the four-day work week",
    "museums",
    "smartphones in schools",
    "team sports",
    "meditation",
    "personal finance",
    "home cooking",
    "bicycles",
    "coffee",
    "tea",
    "dogs as pets",
    "cats as pets",
    "rainforests",
    "the ocean",
    "mountains",
    "deserts",
    "ancient Rome",
    "the printing press",
    "the internet",
    "vaccines",
    "photography",
    "jazz",
    "chess",
    "board games",
    "gardening",
    "bees",
    "solar panels",
    "nuclear power",
    "water conservation",
    "architecture",
    "minimalism",
    "time management",
    "job interviews",
    "public speaking",
    "friendship",
    "reading habits",
    "podcasts",
    "newspapers",
    "electric scooters",
    "tourism",
    "fast fashion",
    "local elections",
    "online learning",
    "homework",
    "school uniforms",
    "open-source software",
    "cybersecurity",
    "robots",
    "3D printing",
    "self-driving cars",
    "smart homes",
    "virtual reality",
    "cryptocurrency",
    "banking",
    "insurance",
    "moving to a new city",
    "starting a podcast",
    "running a marathon",
    "camping",
    "hiking",
    "a vegetarian diet",
    "breakfast",
    "coral reefs",
    "wildfires",
    "earthquakes",
    "volcanoes",
    "the Moon",
    "Mars",
    "black holes",
    "the human brain",
    "the immune system",
    "sleep",
    "nutrition",
    "exercise",
)
ACTIVITIES = (
    "staying focused while studying",
    "saving money on groceries",
    "learning to code",
    "writing a cover letter",
    "preparing for a job interview",
    "keeping a plant alive",
    "training a puppy",
    "planning a trip abroad",
    "running a team meeting",
    "giving feedback to a colleague",
    "starting a small business",
    "learning to swim",
    "improving your handwriting",
    "reducing screen time",
    "cooking for a large group",
    "decluttering a home",
    "writing a short story",
    "negotiating a salary",
    "making new friends in a new city",
    "staying motivated",
    "dealing with stress before exams",
    "learning to play the guitar",
    "getting better sleep",
    "eating healthier",
    "organising a birthday party",
    "reading more books",
    "managing a budget",
    "studying for a math test",
    "taking better photos with a phone",
    "preparing a presentation",
    "starting to run",
    "learning to draw",
    "teaching a child to read",
    "working from home",
    "choosing a laptop",
    "keeping a journal",
    "writing a good email",
    "resolving a conflict with a roommate",
    "becoming a better listener",
    "preparing for a long flight",
)
ROLES = (
    "a travel guide in Paris",
    "a chef in a busy restaurant",
    "a personal fitness coach",
    "a high school history teacher",
    "a detective investigating a missing painting",
    "a customer support agent for an internet provider",
    "a museum tour guide",
    "a ship captain in a storm",
    "a doctor explaining a diagnosis to a patient",
    "a librarian helping a student",
    "a sports commentator at a football final",
    "a tech support specialist",
    "an astronaut on the International Space Station",
    "a career counsellor",
    "a real estate agent",
    "a wildlife ranger",
    "a medieval knight",
    "a pirate",
    "a famous scientist from the 19th century",
    "a startup founder pitching to investors",
    "a movie critic",
    "a tour guide in ancient Rome",
    "a barista",
    "a park ranger",
    "a flight attendant",
)
CONCEPTS = (
    "photosynthesis",
    "gravity",
    "inflation",
    "supply and demand",
    "compound interest",
    "the water cycle",
    "machine learning",
    "encryption",
    "DNA",
    "evolution",
    "plate tectonics",
    "electricity",
    "magnetism",
    "the greenhouse effect",
    "vaccination",
    "antibiotics",
    "blockchain",
    "the stock market",
    "democracy",
    "the scientific method",
    "probability",
    "statistics",
    "the speed of light",
    "black holes",
    "quantum computing",
    "recursion in programming",
    "a neural network",
    "the immune system",
    "climate models",
    "interest rates",
    "how search engines work",
    "how a refrigerator works",
    "how airplanes fly",
    "how vaccines are tested",
    "how the heart works",
    "how batteries store energy",
    "how GPS works",
    "how rainbows form",
    "how the internet routes data",
    "how a bill becomes a law",
)
TEMPLATES = {
    "subject": (
        "Write a blog post about {x}.",
        "Write a short persuasive essay about {x}.",
        "Write a poem about {x}.",
        "What are the pros and cons of {x}?",
        "Give me five interesting facts about {x}.",
        "Write a short speech about {x} for a school assembly.",
        "Explain the history of {x} in a few paragraphs.",
        "Write a product description for a new gadget related to {x}.",
        "Write a social media post encouraging people to learn more about {x}.",
        "Draft an email to a friend recommending that they read about {x}.",
        "Write a short story involving {x}.",
        "What are common misconceptions about {x}?",
        "How might {x} change over the next twenty years?",
        "Write a FAQ with five questions and answers about {x}.",
    ),
    "activity": (
        "What are some tips for {x}?",
        "Give me a step-by-step plan for {x}.",
        "What are the most common mistakes when {x}?",
        "I am struggling with {x}. Can you help?",
        "Write a short guide for beginners on {x}.",
        "Create a one-week schedule for {x}.",
    ),
    "role": (
        "Pretend you are {x}. Introduce yourself and describe a typical day.",
        "Act as {x} and answer this question: what is the most important part of your job?",
        "Imagine you are {x}. Write a short diary entry about your day.",
        "Role-play as {x} and give advice to someone who is new to your field.",
    ),
    "concept": (
        "Explain {x} in simple terms.",
        "Explain {x} to a ten-year-old.",
        "What is {x}, and why does it matter?",
        "Describe {x} with an everyday analogy.",
        "Write a short lesson plan that teaches {x}.",
        "What are the key ideas behind {x}?",
    ),
    "pair": (
        "Compare {x} and {y}.",
        "What are the main differences between {x} and {y}?",
        "Write a short dialogue between two people debating {x} versus {y}.",
    ),
    "title": (
        "Tell me about {x}.",
        "What is {x} known for?",
        "Write a short encyclopedia-style introduction to {x}.",
        "Give me five questions a student might ask about {x}, with answers.",
    ),
    "passage": (
        "Extract the names, places and dates mentioned in this text:\n\n{x}",
        "Write three bullet points that summarise this text:\n\n{x}",
        "Rewrite this text for a young reader:\n\n{x}",
        "What is the main idea of this text?\n\n{x}",
    ),
}


def wiki_material(seed: int) -> tuple[list[str], list[str]]:
    """Titles and passages of the Wikipedia articles in the training split (never the eval documents)."""
    from .prompts import load_prompts

    rows = load_prompts("wiki", split="train", seed=seed)
    titles = sorted({row["prompt"].split('"')[1] for row in rows if '"' in row["prompt"].split("\n")[0]})
    passages = [row["prompt"].split("\n\n", 1)[1] for row in rows if "\n\n" in row["prompt"]]
    return titles, passages


def build(count: int, seed: int) -> list[dict]:
    titles, passages = wiki_material(seed)
    fillers = {
        "subject": SUBJECTS,
        "activity": ACTIVITIES,
        "role": ROLES,
        "concept": CONCEPTS,
        "title": titles,
        "passage": passages,
    }
    rng = random.Random(seed)
    pool = []
    for kind, templates in TEMPLATES.items():
        for template in templates:
            if kind == "pair":
                for x in SUBJECTS:
                    pool.append(template.format(x=x, y=rng.choice([s for s in SUBJECTS if s != x])))
            else:
                pool.extend(template.format(x=x) for x in fillers[kind])
    rng.shuffle(pool)
    return [{"prompt": prompt, "domain": "instruct"} for prompt in dict.fromkeys(pool)][:count]


def load_instruct_prompts():
    """The shipped requests (:data:`INSTRUCT_PROMPTS_FILE`) as a prompt dataset, as ``load_prompts_jsonl`` reads them;
    ``adaflash generate-data --prompts`` takes the same file by path."""
    from .user_prompts import load_prompts_jsonl

    return load_prompts_jsonl(INSTRUCT_PROMPTS_FILE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=str(INSTRUCT_PROMPTS_FILE))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rows = build(args.count, args.seed)
    Path(args.output).write_text("".join(json.dumps(row) + "\n" for row in rows))
    logger.info("%d prompts -> %s", len(rows), args.output)


if __name__ == "__main__":
    main()

"""Templated training prompts for draft distillation, written for this project.

They cover the builtin workload domains (code, chat, rewrite) with many task templates x subjects x
languages, but none of them is an evaluation prompt (`serving/workloads/*.jsonl` is the evaluation set
and is never trained on; `make_prompts` drops any exact match). Deterministic for a given seed.
"""

from __future__ import annotations

import functools
import random

LANGS = ["Python", "Python", "Python", "JavaScript", "TypeScript", "Go", "Rust", "Java", "C", "Ruby", "Kotlin", "C#"]

# (name, args, behaviour)
FUNCS = [
    ("flatten", "nested", "flattens an arbitrarily nested list of lists into a single list"),
    ("is_palindrome", "text", "returns True if the text is a palindrome, ignoring case, spaces and punctuation"),
    ("word_frequencies", "text", "returns a dictionary mapping each lower-cased word to how many times it appears"),
    ("moving_average", "values, window", "returns the list of moving averages over a sliding window"),
    ("merge_intervals", "intervals", "merges overlapping (start, end) intervals and returns them sorted"),
    ("parse_query_string", "url", "parses the query string of a URL into a dictionary of lists"),
    ("fibonacci", "n", "returns the first n Fibonacci numbers, using iteration rather than recursion"),
    ("is_prime", "n", "checks whether an integer is prime using trial division up to the square root"),
    ("primes_below", "limit", "returns all primes below the limit using the sieve of Eratosthenes"),
    ("gcd", "a, b", "computes the greatest common divisor of two integers with Euclid's algorithm"),
    ("camel_to_snake", "name", "converts a camelCase identifier to snake_case"),
    ("snake_to_camel", "name", "converts a snake_case identifier to camelCase"),
    ("count_vowels", "text", "counts the vowels in a string"),
    ("rotate_list", "items, k", "rotates a list to the right by k positions"),
    ("group_by", "items, key", "groups a list of items into a dictionary keyed by the result of a key function"),
    ("deep_merge", "a, b", "recursively merges two dictionaries, with values from b winning on conflicts"),
    ("roman_to_int", "numeral", "converts a Roman numeral string to an integer"),
    ("int_to_roman", "number", "converts an integer between 1 and 3999 to a Roman numeral"),
    ("validate_email", "address", "does a simple validation of an email address and returns True or False"),
    ("transpose", "matrix", "transposes a matrix given as a list of rows"),
    ("binary_to_decimal", "bits", "converts a string of 0s and 1s to its integer value without using built-in parsing"),
    ("second_largest", "numbers", "returns the second largest distinct number, or None if there is none"),
    ("run_length_encode", "text", "compresses a string with run-length encoding, e.g. 'aaab' -> 'a3b1'"),
    ("run_length_decode", "encoded", "decodes a run-length encoded string such as 'a3b1'"),
    ("anagrams", "words", "groups words that are anagrams of each other"),
    ("matrix_multiply", "a, b", "multiplies two matrices given as lists of lists, checking the dimensions"),
    ("celsius_to_fahrenheit", "celsius", "converts a temperature from Celsius to Fahrenheit"),
    ("median", "values", "returns the median of a non-empty list of numbers"),
    ("dedupe", "items", "removes duplicates from a list while keeping the original order"),
    ("chunk_string", "text, width", "splits a string into pieces of at most width characters"),
    ("capitalize_words", "sentence", "capitalises the first letter of every word in a sentence"),
    ("count_lines", "path", "counts the non-empty lines in a text file"),
    ("read_config", "path", "reads a key=value configuration file into a dictionary, skipping comments"),
    ("levenshtein", "a, b", "computes the edit distance between two strings with dynamic programming"),
    ("balanced_brackets", "text", "checks whether the brackets (), [] and {} in a string are balanced"),
    ("top_k", "items, k", "returns the k most common items with their counts"),
    ("pairwise_sum", "numbers, target", "returns the indices of two numbers that add up to the target"),
    ("format_bytes", "size", "formats a number of bytes as a human-readable string such as 1.5 MB"),
    ("parse_duration", "text", "parses strings like '1h30m' or '45s' into a number of seconds"),
    ("days_between", "start, end", "returns the number of days between two dates given as YYYY-MM-DD strings"),
    ("safe_divide", "a, b", "divides a by b and returns None instead of raising when b is zero"),
    ("clamp", "value, low, high", "limits a value to the range [low, high]"),
    ("normalize_whitespace", "text", "collapses runs of whitespace into single spaces and trims the ends"),
    ("extract_urls", "text", "finds all http and https URLs in a block of text"),
    ("histogram", "values, bins", "counts how many values fall into each of a number of equal-width bins"),
    ("binary_search", "items, target", "returns the index of target in a sorted list, or -1 if it is missing"),
    ("bubble_sort", "items", "sorts a list with bubble sort and returns a new list"),
    ("merge_sorted", "a, b", "merges two sorted lists into one sorted list in linear time"),
    ("quicksort", "items", "sorts a list with the quicksort algorithm"),
    ("caesar_cipher", "text, shift", "encrypts text with a Caesar cipher, keeping non-letters unchanged"),
    ("password_strength", "password", "rates a password as weak, medium or strong using simple rules"),
    ("json_pretty", "data", "returns a JSON string of the data with sorted keys and an indentation of 2"),
    ("sum_digits", "n", "returns the sum of the decimal digits of a non-negative integer"),
    ("reverse_words", "sentence", "reverses the order of the words in a sentence"),
    ("longest_common_prefix", "words", "returns the longest common prefix of a list of strings"),
    ("find_missing_number", "numbers", "finds the one missing number in a list containing 1..n with one gap"),
    ("power_set", "items", "returns all subsets of a list"),
    ("permutations", "items", "returns all permutations of a list without using a library"),
    ("is_leap_year", "year", "returns whether a year is a leap year in the Gregorian calendar"),
    ("count_words_in_file", "path", "counts the words in a text file and returns the ten most common"),
    ("truncate", "text, limit", "shortens text to at most limit characters, adding an ellipsis when it cuts"),
    ("to_title_case", "text", "converts text to title case but keeps small words like 'and' and 'of' lower-case"),
    ("mask_card_number", "number", "masks all but the last four digits of a credit card number"),
    ("average_by_key", "records, key", "averages a numeric field of a list of dictionaries grouped by key"),
]

EXTRAS = [
    "Include a short docstring and two examples.",
    "Add type hints.",
    "Explain the time complexity.",
    "Include a few test cases.",
    "Handle invalid input by raising a clear error.",
    "Keep it short and readable.",
    "Add comments explaining each step.",
    "Show how to call it.",
    "",
]

CLASSES = [
    ("Stack", "push, pop, peek and is_empty"),
    ("Queue", "enqueue, dequeue and size, backed by two stacks"),
    ("BankAccount", "deposit, withdraw (refusing overdrafts) and a balance property"),
    ("Counter", "increment, decrement, reset and a value property"),
    ("Inventory", "add_item, remove_item and total_value"),
    ("Matrix", "addition, multiplication and transpose"),
    ("RateLimiter", "allow() that permits at most n calls per second"),
    ("TodoList", "add, complete, remove and list of pending tasks"),
    ("Temperature", "celsius and fahrenheit properties that stay in sync"),
    ("ShoppingCart", "add_product, remove_product, total and apply_discount"),
    ("Graph", "add_edge, neighbours and a breadth-first search"),
    ("LinkedList", "append, prepend, remove and iteration"),
    ("PriorityQueue", "push with a priority and pop of the smallest item"),
    ("Timer", "start, stop and elapsed time, usable as a context manager"),
    ("Vector2D", "addition, scaling, dot product and length"),
    ("Library", "add_book, lend_book, return_book and available_books"),
    ("EventBus", "subscribe, unsubscribe and publish"),
    ("TTLCache", "get and set where entries expire after a number of seconds"),
]

SNIPPETS = [
    "def total_price(items):\n    total = 0\n    for item in items:\n        total = item['price'] * item['qty']\n    return total",
    "def find_max(values):\n    best = 0\n    for v in values:\n        if v > best:\n            best = v\n    return best",
    "def read_lines(path):\n    f = open(path)\n    lines = f.readlines()\n    return [l.strip() for l in lines]",
    "def count_words(text):\n    counts = {}\n    for w in text.split():\n        counts[w] += 1\n    return counts",
    "def last_n(items, n):\n    return items[len(items) - n - 1:]",
    "def is_even(n):\n    if n % 2 == 1:\n        return True\n    return False",
    "def add_item(item, bucket=[]):\n    bucket.append(item)\n    return bucket",
    "def factorial(n):\n    result = 0\n    for i in range(1, n):\n        result *= i\n    return result",
    "def get_user_name(user):\n    return user['profile']['name'].title()",
    "def percent(part, whole):\n    return part / whole * 100",
    "def remove_negatives(numbers):\n    for n in numbers:\n        if n < 0:\n            numbers.remove(n)\n    return numbers",
    "def reverse_string(s):\n    out = ''\n    for i in range(len(s)):\n        out += s[len(s) - i]\n    return out",
    "def parse_age(text):\n    age = int(text)\n    if age < 0 or age > 150:\n        print('bad age')\n    return age",
    "def filter_adults(people):\n    result = []\n    for p in people:\n        if p['age'] > 18:\n            result.append(p['name'])\n    return result",
    "def join_names(names):\n    s = ''\n    for n in names:\n        s = s + n + ', '\n    return s",
    "def squares(n):\n    out = []\n    i = 0\n    while i < n:\n        out.append(i * i)\n    return out",
    "def contains_duplicate(items):\n    for i in range(len(items)):\n        for j in range(len(items)):\n            if items[i] == items[j]:\n                return True\n    return False",
    "def fetch_json(url):\n    import requests\n    r = requests.get(url)\n    return r.json()",
    "def average_score(scores):\n    return sum(scores) / len(scores)",
    "def to_int_list(strings):\n    result = []\n    for s in strings:\n        result.append(int(s))\n    return result",
    "def word_lengths(sentence):\n    lengths = {}\n    for word in sentence.split(' '):\n        lengths[word] = len(word)\n    return lengths",
    "def save_report(path, rows):\n    f = open(path, 'w')\n    for row in rows:\n        f.write(','.join(row))\n    f.close()",
    "def compare(a, b):\n    if a > b:\n        return 1\n    elif a < b:\n        return -1",
    "def apply_discount(price, percent):\n    return price - price * percent",
    "def first_word(text):\n    return text.split(' ')[0]",
    "def ages_to_groups(ages):\n    groups = {}\n    for a in ages:\n        key = a / 10 * 10\n        groups.setdefault(key, []).append(a)\n    return groups",
]

SNIPPET_TASKS = [
    "Fix the bug in this function and explain what was wrong:",
    "Add type hints and a docstring to this Python function without changing its behaviour:",
    "Write pytest unit tests for this function, including edge cases:",
    "Explain what this Python code does, line by line:",
    "Convert this Python function to idiomatic JavaScript, keeping the same behaviour:",
    "Convert this Python function to Go:",
    "Refactor this function to be more Pythonic:",
    "Review this code and list any problems you see:",
    "Add error handling to this function:",
    "Rename the variables in this function so the code explains itself. Do not change the logic.",
    "Make this function more efficient and explain why your version is faster:",
    "What happens when this function is called with an empty list or empty string? Fix it if needed.",
    "Rewrite this function using a list comprehension or built-in functions where possible:",
]

SQL_TABLES = [
    ("employees(id, name, department_id, salary, hired_at)", "departments(id, name)"),
    ("orders(id, customer_id, total, created_at)", "customers(id, name, country)"),
    ("products(id, name, category, price)", "order_items(order_id, product_id, quantity)"),
    ("students(id, name, class_id)", "grades(student_id, subject, score)"),
    ("posts(id, author_id, title, created_at)", "comments(id, post_id, body, created_at)"),
    ("flights(id, origin, destination, departure, price)", "bookings(id, flight_id, passenger_name)"),
    ("books(id, title, author_id, published_year)", "authors(id, name, country)"),
]
SQL_TASKS = [
    "returns the top 5 rows by the numeric column, joined with the second table",
    "counts rows per group in the second table and shows groups with more than 10 rows",
    "finds rows in the first table that have no matching row in the second table",
    "computes the average of a numeric column per month for 2024",
    "lists duplicate names in the first table together with how many times they appear",
    "returns a running total ordered by date using a window function",
    "deletes rows older than one year from the first table, safely",
    "creates both tables with sensible types, primary keys and a foreign key",
]

SHELL_TASKS = [
    "counts the number of lines in every .py file under the current directory and prints the total",
    "renames all .jpeg files in a folder to .jpg",
    "prints the 5 most frequent IP addresses in an nginx access log",
    "deletes files older than 30 days in /var/tmp, asking nothing but printing what it removes",
    "checks whether a website returns HTTP 200 and prints an error otherwise",
    "finds all TODO comments in a git repository and prints file and line number",
    "monitors the disk usage and prints a warning when a partition is more than 90% full",
    "converts all .wav files in a directory to .mp3 with ffmpeg",
    "prints the size of each subdirectory sorted from largest to smallest",
    "replaces a word in all .txt files of a directory in place",
    "downloads a list of URLs from a file, one per line, with retries",
    "shows the processes using the most memory",
]

REGEX_TASKS = [
    "US phone numbers like (555) 123-4567 or 555-123-4567",
    "hexadecimal colour codes such as #fff or #1a2b3c",
    "IPv4 addresses with each part between 0 and 255",
    "times in 24-hour HH:MM format",
    "hashtags in a tweet",
    "UK postcodes in the common formats",
    "semantic version numbers such as 1.2.3 or 2.0.0-beta.1",
    "words that start with a capital letter",
    "lines that contain only whitespace",
    "prices in dollars like $4.99 or $1,200",
]

CONCEPT_PAIRS = [
    ("a list", "a tuple"), ("a process", "a thread"), ("TCP", "UDP"), ("git merge", "git rebase"),
    ("an abstract class", "an interface"), ("a shallow copy", "a deep copy"), ("SQL", "NoSQL databases"),
    ("`let`", "`var` in JavaScript"), ("a generator", "a list in Python"), ("composition", "inheritance"),
    ("synchronous", "asynchronous code"), ("a compiler", "an interpreter"), ("a stack", "a heap (memory)"),
    ("`__str__`", "`__repr__` in Python"), ("GET", "POST requests"), ("unit tests", "integration tests"),
    ("a class method", "a static method in Python"), ("`==`", "`===` in JavaScript"),
    ("a hash map", "a binary search tree"), ("REST", "GraphQL"), ("Docker", "a virtual machine"),
    ("mutable", "immutable objects"), ("an array", "a linked list"), ("`map`", "`filter` in Python"),
]
CONCEPTS = [
    "recursion", "Big-O notation", "closures in JavaScript", "decorators in Python", "dependency injection",
    "the Python GIL", "database indexes", "the event loop in Node.js", "memoization", "list comprehensions",
    "context managers in Python", "virtual environments in Python", "the SOLID principles", "hash functions",
    "garbage collection", "race conditions", "dynamic programming", "CORS", "JSON Web Tokens", "regular expressions",
    "ownership in Rust", "goroutines and channels in Go", "promises in JavaScript", "type hints in Python",
    "git branches", "SQL joins", "caching", "pagination in a REST API", "environment variables",
    "exceptions and try/except", "f-strings in Python", "the `with` statement", "lambda functions",
    "`*args` and `**kwargs`", "the `yield` keyword", "unit testing with mocks", "binary search", "Docker volumes",
]

CHAT_TOPICS = [
    "how rainbows form", "how the heart pumps blood", "why the moon has phases", "how airplanes stay in the air",
    "what inflation is", "how batteries store energy", "why we dream", "how the internet works",
    "what photosynthesis is", "how earthquakes happen", "what a stock market index is", "how GPS finds my location",
    "why leaves change colour in autumn", "how a microwave oven heats food", "what DNA is", "how tides work",
    "what causes the seasons", "how solar panels make electricity", "why the ocean is salty", "how bees make honey",
    "what an interest rate is", "how vaccines are tested", "why we get fevers", "how a bill becomes a law",
    "how recycling works", "what machine learning is", "how noise travels through walls", "why ice floats",
    "how a thermostat works", "what a budget deficit is", "how the immune system fights a cold",
    "how coffee affects the body", "why cats purr", "how volcanoes form", "what a credit card interest charge is",
]
ADVICE = [
    "stay focused when working from home", "save money on groceries", "prepare for a marathon",
    "make new friends after moving to a new city", "keep a houseplant alive", "start a vegetable garden",
    "ask for a raise", "prepare for a job interview as a software developer", "study for an exam in two weeks",
    "reduce stress before a big presentation", "learn to cook simple meals", "organise a small wedding on a budget",
    "get into the habit of reading more books", "improve my posture at a desk", "choose a first car",
    "train a puppy to stop biting", "plan a road trip with kids", "write a good cover letter", "drink more water",
    "deal with a difficult neighbour", "negotiate the price of a used car", "get better at public speaking",
    "start running at 40", "make my small apartment feel bigger", "keep in touch with friends who live far away",
    "learn to play the guitar", "manage my time as a student with a part-time job", "prepare for a long flight",
    "choose a laptop for university", "start investing with a small amount of money", "stop checking my phone so often",
    "motivate myself to exercise in winter", "help my child with homework without arguing", "reduce food waste",
    "pack light for a one-week trip", "prepare my home for a cold winter", "take better photos with my phone",
]
CHAT_TEMPLATES = [
    "Can you explain {topic} in simple terms?",
    "Explain {topic} as if I were ten years old.",
    "I've always wondered about {topic}. Could you explain it briefly?",
    "Give me a short explanation of {topic}, with one everyday example.",
]
ADVICE_TEMPLATES = [
    "How can I {advice}?",
    "What are some practical tips to {advice}?",
    "Give me five tips to {advice}.",
    "I want to {advice}. Where should I start?",
    "What mistakes should I avoid when I try to {advice}?",
]
SYSTEMS = [
    "You are a helpful assistant. Keep answers short and practical.",
    "You are a friendly tutor who explains things step by step.",
    "You are a concise technical assistant.",
    "You are a patient teacher for beginners.",
]

PARAGRAPHS = [
    "Our team spent the last quarter moving the billing system to the new cloud provider. The migration took longer than planned because several old reports depended on a database that nobody had documented. In the end we finished two weeks late, but the new system is faster and costs less to run.",
    "The local bakery on Elm Street has been open for forty years. Every morning the owner bakes bread, croissants and cinnamon rolls before sunrise. Many customers say the shop feels like part of the family, and the queue on Saturday mornings often reaches the corner.",
    "Remote work has changed how many companies hire. Instead of looking only in their own city, employers can now find talent anywhere. However, this also means that workers compete with people from all over the world, and time zones can make collaboration difficult.",
    "The museum will open a new exhibition about the history of flight next month. Visitors can see early gliders, a restored biplane and a flight simulator. Tickets for the opening weekend are already available online, and children under six enter for free.",
    "Drinking enough water is important for health. Water helps regulate body temperature, keeps joints moving smoothly and supports digestion. Most adults need around two litres a day, but this depends on the weather, physical activity and individual needs.",
    "The city plans to plant ten thousand trees over the next five years. Officials say the trees will provide shade, reduce air pollution and make neighbourhoods more pleasant. Residents can request a tree for their street through the city website.",
    "i wanted to let you know that the meeting tomorrow is moved to 3pm because the conference room is booked in the morning. please bring the sales numbers from last month and your ideas for the new campaign. let me know if you cant make it",
    "The new phone has a bigger screen, a faster processor and a camera that works better in low light. The battery lasts about two days with normal use. However, it is more expensive than the previous model and does not come with a charger in the box.",
    "Learning a musical instrument takes patience. Beginners often feel frustrated because progress seems slow in the first months. Practising a little every day is more effective than practising for hours once a week, and playing simple songs you enjoy helps keep motivation high.",
    "Our customer support team received twice as many tickets in March as in February. Most of the new tickets were about the password reset page, which was broken for three days after an update. The bug is now fixed, and we are adding tests to make sure it does not happen again.",
    "Volunteers cleaned the river bank last Sunday and collected more than two hundred kilograms of rubbish. Most of it was plastic bottles and bags. The organisers hope to repeat the event every spring and invite schools to take part.",
    "The report shows that sales increased by twelve percent compared with last year. Growth was strongest in the online store, while sales in physical shops stayed about the same. The company plans to invest more in its website and delivery service next year.",
    "hi team, the printer on the second floor is broken again, it jams every time you print more than 5 pages. IT says a new one will come next week. until then please use the printer near the kitchen",
    "Sleep plays a key role in memory and learning. During deep sleep, the brain organises information collected during the day. People who sleep less than six hours a night often find it harder to concentrate and remember new things.",
    "The hotel was close to the beach and the staff were friendly, but the room was small and the wifi stopped working every evening. Breakfast had a good choice of fresh fruit and bread. Overall it was good value for the price, though I would not stay longer than a weekend.",
    "Electric cars are becoming more popular as battery prices fall and charging networks grow. They produce no exhaust emissions while driving and are cheaper to maintain. However, buyers still worry about range on long trips and the time it takes to recharge.",
    "The school will introduce a new timetable in September. Lessons will start at 8:45 instead of 8:30, and there will be a longer lunch break. Parents are invited to an information evening on 3 July to ask questions.",
    "Composting turns kitchen scraps and garden waste into rich soil. You need a mix of green material, like vegetable peels, and brown material, like dry leaves or paper. Turning the pile every few weeks adds air and speeds up the process.",
    "we are looking for someone who can start asap and work with our small team on the mobile app. you should know react native and be happy to talk to customers sometimes. we offer flexible hours and a friendly office",
    "The train company announced that tickets will become five percent more expensive from January. It says the money will pay for new carriages and more frequent trains at peak times. Passenger groups have criticised the increase, saying services are often late.",
    "Last weekend we hiked to the top of the mountain. The path was steep and rocky, and it started to rain halfway up. When we reached the summit the clouds cleared, and we could see the lake and the villages below.",
    "The software update adds a dark mode, improves search speed and fixes a bug that caused the app to crash when uploading large files. Users should install the update from the settings menu. Older devices may need to restart after installing it.",
    "Many people believe that goldfish have a memory of only three seconds, but studies show they can remember things for months. Fish can be trained to respond to sounds and colours, and some can even learn simple tasks to get food.",
    "The library is extending its opening hours during the exam period. From 1 May to 15 June it will be open until midnight on weekdays. Students must show their card at the entrance after 8 pm.",
    "Starting a small business requires careful planning. You need to understand your customers, calculate your costs and decide how you will find your first clients. Many new businesses fail because they run out of money before they become profitable.",
    "the package arrived three days late and the box was damaged. one of the glasses inside was broken. i contacted customer service twice but nobody answered. i want a refund or a replacement as soon as possible",
    "Bees are essential for growing many of the fruits and vegetables we eat. As they collect nectar, they carry pollen from flower to flower. In recent years bee populations have declined because of pesticides, disease and the loss of wild flowers.",
    "Our quarterly planning meeting decided three things. First, the mobile release moves to October. Second, Anna will lead the new analytics project. Third, the team will hire two more engineers before the end of the year.",
]
REWRITE_TASKS = [
    "Summarise this paragraph in one sentence:",
    "Summarise this text in two sentences:",
    "Rewrite this paragraph in a more formal tone:",
    "Rewrite this text in a friendly, casual tone:",
    "Fix the grammar, spelling and punctuation of this text:",
    "Turn this text into a bulleted list of the key points:",
    "Translate this paragraph into French:",
    "Translate this paragraph into Spanish:",
    "Translate this paragraph into German:",
    "Translate this paragraph into Italian:",
    "Rewrite this paragraph for a young child:",
    "Make this text shorter, at most 30 words:",
    "Paraphrase this paragraph using different words:",
    "Write a short headline for this paragraph:",
    "Rewrite this as a polite email:",
    "Rewrite this text in the passive voice where natural:",
    "Rewrite this paragraph in the first person:",
    "List three questions a reader might ask after reading this text:",
    "Rewrite this text to be clearer and more concise:",
    "Turn this text into a short social media post:",
    "Extract the facts from this text as a numbered list:",
    "Rewrite this text in plain English for a general audience:",
]


def _code_prompts(rng: random.Random) -> list[str]:
    out = []
    for name, args, what in FUNCS:
        for lang in rng.sample(LANGS, 7):
            out.append(f"Write a {lang} function `{name}({args})` that {what}. {rng.choice(EXTRAS)}".strip())
    for cls, methods in CLASSES:
        for lang in ("Python", "Python", "Java", "TypeScript"):
            out.append(f"Write a {lang} class `{cls}` with {methods}. {rng.choice(EXTRAS)}".strip())
    for snippet in SNIPPETS:
        for task in rng.sample(SNIPPET_TASKS, 11):
            out.append(f"{task}\n\n```python\n{snippet}\n```")
    for t1, t2 in SQL_TABLES:
        for task in SQL_TASKS:
            out.append(f"Write a SQL query using tables `{t1}` and `{t2}` that {task}.")
    for task in SHELL_TASKS:
        out.append(f"Write a bash one-liner that {task}.")
        out.append(f"Write a short bash script that {task}, with comments.")
        out.append(f"Write a Python script that {task}.")
    for what in REGEX_TASKS:
        out.append(f"Write a regular expression that matches {what}, and show how to use it in Python.")
        out.append(f"Write a JavaScript regular expression for {what} with a few test strings.")
    for a, b in CONCEPT_PAIRS:
        out.append(f"Explain the difference between {a} and {b} with short code examples.")
        out.append(f"When should I use {a} instead of {b}? Give an example.")
    for c in CONCEPTS:
        out.append(f"Explain {c} with a short code example.")
        out.append(f"What is {c}? Give a simple example and one common mistake.")
        out.append(f"Explain {c} to a beginner programmer.")
    return out


def _chat_prompts(rng: random.Random) -> list[object]:
    out: list[object] = []
    for topic in CHAT_TOPICS:
        for t in rng.sample(CHAT_TEMPLATES, 3):
            out.append(t.format(topic=topic))
    for advice in ADVICE:
        for t in rng.sample(ADVICE_TEMPLATES, 3):
            out.append(t.format(advice=advice))
    for advice in rng.sample(ADVICE, 20):
        out.append([{"role": "system", "content": rng.choice(SYSTEMS)},
                    {"role": "user", "content": f"How can I {advice}?"}])
    for topic in rng.sample(CHAT_TOPICS, 20):
        out.append([{"role": "user", "content": f"Can you explain {topic}?"},
                    {"role": "assistant", "content": f"Sure. In short, {topic} comes down to a few simple ideas."},
                    {"role": "user", "content": "Can you give me a concrete example?"}])
    return out


def _rewrite_prompts(rng: random.Random) -> list[str]:
    out = []
    for para in PARAGRAPHS:
        for task in rng.sample(REWRITE_TASKS, 16):
            out.append(f'{task}\n\n"{para}"')
    return out


def make_prompts(n: int | None = None, seed: int = 0) -> list[dict]:
    """Up to `n` (all when None) training prompts as workload-style dicts {id, domain, prompt|messages},
    interleaved across domains so any prefix is a balanced sample."""
    rng = random.Random(seed)
    pools = {"code": _code_prompts(rng), "chat": _chat_prompts(rng), "rewrite": _rewrite_prompts(rng)}
    evaluation = _evaluation_texts()
    for pool in pools.values():
        rng.shuffle(pool)
    # code is the domain the go/no-go is judged on: weight it 2:1:1
    order = ["code", "chat", "code", "rewrite"]
    items, idx = [], {d: 0 for d in pools}
    while any(idx[d] < len(pools[d]) for d in pools):
        for d in order:
            if idx[d] < len(pools[d]):
                p = pools[d][idx[d]]
                idx[d] += 1
                if isinstance(p, str) and p in evaluation:
                    continue
                item = {"id": f"distill-{d}-{idx[d]:05d}", "domain": d}
                item.update({"prompt": p} if isinstance(p, str) else {"messages": p})
                items.append(item)
    return items if n is None else items[:n]


def interleave(a: list[dict], b: list[dict]) -> list[dict]:
    """a and b merged evenly (in proportion to their sizes), so any prefix holds both."""
    out, i, j = [], 0, 0
    while i < len(a) or j < len(b):
        if j >= len(b) or (i < len(a) and i * len(b) <= j * len(a)):
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    return out


def _evaluation_texts() -> set[str]:
    from serving.workloads import BUILTIN_DOMAINS, load_workload

    texts = set()
    for d in BUILTIN_DOMAINS:
        for p in load_workload(d):
            if p.prompt is not None:
                texts.add(p.prompt)
    return texts


# ------------------------------------------------------------------ offline code text (teacher-forced only)
CODE_INTROS = [
    "Here's a Python function that {what}:",
    "Here is one way to write it:",
    "Sure! Here's an implementation:",
    "Here's a simple implementation of `{name}`:",
    "You can write it like this:",
]


def _python_files(root, skip: set[str]) -> list:
    """The .py files under `root`, sorted, outside folders named in `skip` and not named test*."""
    return sorted(p for p in root.rglob("*.py")
                  if not set(p.relative_to(root).parts[:-1]) & skip and not p.name.startswith("test"))


def _documented_functions(root, files, max_lines: int) -> list[tuple[str, str, str, str, str]]:
    """(id, name, args, first docstring line, source) of the documented public functions (module level and
    class methods) in `files` under `root`, in the files' order."""
    import ast
    import textwrap

    out = []
    for path in files:
        try:
            src = path.read_text(encoding="utf-8")
            tree = ast.parse(src)
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        lines = src.splitlines()
        nodes = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            nodes += [n for n in cls.body if isinstance(n, ast.FunctionDef)]
        for node in nodes:
            if node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            n = node.end_lineno - node.lineno + 1
            if not doc or not doc.strip() or n > max_lines or n < 4:
                continue
            first = doc.strip().splitlines()[0].strip().rstrip(".")
            if len(first) < 12:
                continue
            what = first[0].lower() + first[1:]
            args = ", ".join(a.arg for a in node.args.args if a.arg != "self")
            body = textwrap.dedent("\n".join(lines[node.lineno - 1: node.end_lineno]))
            out.append((f"{path.relative_to(root)}-{node.lineno}", node.name, args, what, body))
    return out


def _stdlib_functions(max_lines: int = 40) -> list[tuple[str, str, str, str, str]]:
    """The documented public functions of the Python standard library that ships with the interpreter,
    in a stable order (see _documented_functions). A new list each call (callers shuffle it); the parse
    of the library is done once per process."""
    return list(_stdlib_functions_parsed(max_lines))


@functools.lru_cache(maxsize=4)
def _stdlib_functions_parsed(max_lines: int) -> tuple[tuple[str, str, str, str, str], ...]:
    import sysconfig
    from pathlib import Path

    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idlelib", "lib2to3", "site-packages", "turtledemo", "ensurepip", "tkinter"}
    return tuple(_documented_functions(root, _python_files(root, skip), max_lines))


STDLIB_ASKS = [
    "Write a {lang} function `{name}({args})` that does the following: {what}.",
    "Write a function `{name}({args})` in {lang}. It should {what}.",
    "How would I implement `{name}({args})` in {lang}? It should: {what}.",
    "I need a {lang} function that can {what}. Call it `{name}`. {extra}",
    "Implement `{name}({args})` in {lang}: {what}. {extra}",
]


def _function_prompts(funcs, rng: random.Random, id_prefix: str, evaluation: set[str]) -> list[dict]:
    """One code prompt per function: even positions ask for it from its docstring's first line (in a random
    language), odd ones give its source with a task from SNIPPET_TASKS. Evaluation prompts are dropped."""
    items = []
    for i, (fid, name, args, what, body) in enumerate(funcs):
        if i % 2 == 0:
            text = rng.choice(STDLIB_ASKS).format(lang=rng.choice(LANGS), name=name, args=args, what=what,
                                                   extra=rng.choice(EXTRAS)).strip()
        else:
            text = f"{rng.choice(SNIPPET_TASKS)}\n\n```python\n{body}\n```"
        if text in evaluation:
            continue
        items.append({"id": f"{id_prefix}-{fid}", "domain": "code", "prompt": text})
    return items


def stdlib_prompts(limit: int | None = None, seed: int = 0) -> list[dict]:
    """Code prompts (no answers: the target writes them) built from the standard library's documented
    functions: half ask for a function from its docstring's first line (in a random language), half give
    the function's source with a task from SNIPPET_TASKS. Deterministic for a seed; never an evaluation prompt."""
    rng = random.Random(seed + 1)
    funcs = _stdlib_functions(max_lines=24)
    rng.shuffle(funcs)
    items = _function_prompts(funcs, rng, "stdlib-prompt", _evaluation_texts())
    return items if limit is None else items[:limit]


# Installed packages whose documented functions make more code prompts (--package-prompts): pure-Python,
# well documented, and all installed with specfinops itself, so a checkout that can run distill has them.
PACKAGES = ("sqlalchemy", "alembic", "jinja2", "click", "dateutil", "requests", "httpx", "attr", "packaging",
            "pygments", "rich", "networkx", "sympy", "pandas", "numpy", "markdown_it", "jsonschema", "mako",
            "starlette", "fastapi", "pydantic", "typer", "tqdm", "apscheduler", "pluggy", "_pytest", "setuptools",
            "pip", "huggingface_hub", "transformers", "streamlit", "altair", "narwhals", "fsspec", "psutil")


def package_versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """{import name: installed version} of the packages that are installed (what --package-prompts read)."""
    import importlib.metadata as md
    import importlib.util

    dists = md.packages_distributions()
    out = {}
    for pkg in packages:
        if importlib.util.find_spec(pkg) is None:
            continue
        names = dists.get(pkg) or [pkg]
        try:
            out[pkg] = md.version(names[0])
        except md.PackageNotFoundError:
            out[pkg] = "unknown"
    return out


def _package_functions(pkg: str, max_lines: int) -> list[tuple[str, str, str, str, str]]:
    """A package's documented public functions (a new list each call; parsed once per process)."""
    return list(_package_functions_parsed(pkg, max_lines))


@functools.lru_cache(maxsize=64)
def _package_functions_parsed(pkg: str, max_lines: int) -> tuple[tuple[str, str, str, str, str], ...]:
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec(pkg)
    if spec is None:
        return ()
    if spec.submodule_search_locations:
        root = Path(list(spec.submodule_search_locations)[0])
        files = _python_files(root, {"test", "tests", "testing", "_vendor", "vendor", "_vendored"})
        top = root.parent
    else:
        files, top = [Path(spec.origin)], Path(spec.origin).parent
    return tuple(_documented_functions(top, files, max_lines))


def package_prompts(limit: int | None = None, seed: int = 0, packages: tuple[str, ...] = PACKAGES) -> list[dict]:
    """Code prompts made like stdlib_prompts from the documented functions of installed packages (PACKAGES;
    those not installed are skipped), taken round-robin across packages so any prefix spreads over all of
    them. Deterministic for a seed and the installed versions (see package_versions)."""
    rng = random.Random(seed + 2)
    per_pkg = []
    for pkg in packages:
        funcs = _package_functions(pkg, max_lines=24)
        rng.shuffle(funcs)
        per_pkg.append(funcs)
    funcs, i = [], 0
    while any(i < len(f) for f in per_pkg):
        funcs += [f[i] for f in per_pkg if i < len(f)]
        i += 1
    items = _function_prompts(funcs, rng, "package-prompt", _evaluation_texts())
    return items if limit is None else items[:limit]


def stdlib_code_items(limit: int | None = None, seed: int = 0, max_lines: int = 40) -> list[dict]:
    """Prompt + answer pairs built from the documented functions of the Python standard library that
    ships with the interpreter: the prompt asks for the function (from its docstring's first line), the
    answer shows its source in a fenced block. Used teacher-forced (the target's distributions label it),
    never generated, so it adds code volume at prefill speed."""
    rng = random.Random(seed)
    items = []
    for fid, name, args, what, body in _stdlib_functions(max_lines):
        prompt = rng.choice(STDLIB_ASKS[:3]).format(lang="Python", name=name, args=args, what=what)
        intro = rng.choice(CODE_INTROS).format(what=what, name=name)
        answer = f"{intro}\n\n```python\n{body}\n```"
        items.append({"id": f"stdlib-{fid}", "domain": "code", "prompt": prompt, "answer": answer})
    rng.shuffle(items)
    return items if limit is None else items[:limit]

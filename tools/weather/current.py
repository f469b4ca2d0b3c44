#!/usr/bin/env python3
"""weather__current: current conditions for a city from the bundled data/cities.json.

Input (stdin, JSON object):  {"city": "Paris"}
Output (stdout, JSON object): current conditions for that city.
Exit codes: 0 ok, 1 unknown city / data error, 2 invalid input.
"""
import json
import os
import sys
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
DATA_FILE = os.path.join(HERE, "data", "cities.json")


def fail(code, message):
    sys.stderr.write("current: " + message + "\n")
    sys.exit(code)


def fold(name):
    """Case- and accent-insensitive key: 'São Paulo' -> 'sao paulo'."""
    decomposed = unicodedata.normalize("NFKD", name)
    stripped = "".join(c for c in decomposed if not unicodedata.combining(c))
    return " ".join(stripped.casefold().split())


def read_params():
    raw = sys.stdin.buffer.read().decode("utf-8", errors="strict").strip()
    if not raw:
        return {}
    try:
        params = json.loads(raw)
    except json.JSONDecodeError as exc:
        fail(2, "input is not valid JSON: %s" % exc)
    if not isinstance(params, dict):
        fail(2, "input must be a JSON object")
    return params


def load_cities():
    try:
        with open(DATA_FILE, encoding="utf-8") as fh:
            return json.load(fh)["cities"]
    except (OSError, ValueError, KeyError) as exc:
        fail(1, "cannot read %s: %s" % (DATA_FILE, exc))


def main():
    params = read_params()
    city = params.get("city")
    if not isinstance(city, str) or not city.strip():
        fail(2, "parameter 'city' is required and must be a non-empty string")

    cities = load_cities()
    wanted = fold(city)
    match = next((c for c in cities if fold(c["name"]) == wanted), None)
    if match is None:
        known = ", ".join(c["name"] for c in cities)
        fail(1, "unknown city %r. Known cities: %s" % (city, known))

    result = {
        "city": match["name"],
        "country": match["country"],
        "lat": match["lat"],
        "lon": match["lon"],
        "temperature_c": match["temperature_c"],
        "temperature_f": round(match["temperature_c"] * 9 / 5 + 32, 1),
        "condition": match["condition"],
        "humidity": match["humidity"],
        "wind_kph": match["wind_kph"],
        "source": "bundled sample data (data/cities.json), not live observations",
    }
    sys.stdout.buffer.write(json.dumps(result, ensure_ascii=False).encode("utf-8") + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

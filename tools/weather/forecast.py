#!/usr/bin/env python3
"""weather__forecast: deterministic N-day forecast derived from data/cities.json.

Input (stdin, JSON object):  {"city": "Paris", "days": 3}
Output (stdout, JSON object): {"city", "country", "days", "forecast": [...]}
The forecast is pure arithmetic on the city's bundled values and the day index,
so the same input always gives the same output (no randomness, no clock).
Exit codes: 0 ok, 1 unknown city / data error, 2 invalid input.
"""
import json
import os
import sys
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
DATA_FILE = os.path.join(HERE, "data", "cities.json")

DEFAULT_DAYS = 3
MAX_DAYS = 7
# Fixed day-by-day temperature swing (degrees C) applied to the current temperature.
TEMP_SWING = [0.0, 1.2, -0.8, 2.1, -1.5, 0.6, -2.3]
# Condition cycle used for days after the first one.
CONDITION_CYCLE = [
    "sunny", "partly cloudy", "overcast", "light rain",
    "showers", "partly cloudy", "clear",
]
WET = {"light rain", "showers", "thunderstorms", "snow showers"}


def fail(code, message):
    sys.stderr.write("forecast: " + message + "\n")
    sys.exit(code)


def fold(name):
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


def parse_days(value):
    if value is None:
        return DEFAULT_DAYS
    # Query parameters may arrive as strings if the caller did not coerce them.
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        fail(2, "parameter 'days' must be an integer between 1 and %d" % MAX_DAYS)
    if not 1 <= value <= MAX_DAYS:
        fail(2, "parameter 'days' must be between 1 and %d, got %d" % (MAX_DAYS, value))
    return value


def load_cities():
    try:
        with open(DATA_FILE, encoding="utf-8") as fh:
            return json.load(fh)["cities"]
    except (OSError, ValueError, KeyError) as exc:
        fail(1, "cannot read %s: %s" % (DATA_FILE, exc))


def clamp(value, low, high):
    return max(low, min(high, value))


def day_forecast(city, day):
    """Forecast for day index `day` (0 = today)."""
    seed = sum(ord(ch) for ch in city["name"])  # stable per city, unlike hash()
    temp = city["temperature_c"] + TEMP_SWING[day % len(TEMP_SWING)]
    if day == 0:
        condition = city["condition"]
    else:
        condition = CONDITION_CYCLE[(seed + day) % len(CONDITION_CYCLE)]
    precip = city["humidity"] * 0.6 + ((seed + 7 * day) % 21) - 10
    if condition in WET:
        precip += 30
    humidity = clamp(city["humidity"] + ((seed + 3 * day) % 11) - 5, 5, 100)
    wind = city["wind_kph"] * (1 + 0.1 * ((day % 3) - 1))
    return {
        "day": day + 1,
        "day_offset": day,
        "condition": condition,
        "high_c": round(temp + 3.5, 1),
        "low_c": round(temp - 4.0 - city["humidity"] / 40.0, 1),
        "precipitation_chance": int(clamp(round(precip), 0, 100)),
        "humidity": int(humidity),
        "wind_kph": round(wind, 1),
    }


def main():
    params = read_params()
    city_name = params.get("city")
    if not isinstance(city_name, str) or not city_name.strip():
        fail(2, "parameter 'city' is required and must be a non-empty string")
    days = parse_days(params.get("days"))

    cities = load_cities()
    wanted = fold(city_name)
    city = next((c for c in cities if fold(c["name"]) == wanted), None)
    if city is None:
        known = ", ".join(c["name"] for c in cities)
        fail(1, "unknown city %r. Known cities: %s" % (city_name, known))

    result = {
        "city": city["name"],
        "country": city["country"],
        "days": days,
        "forecast": [day_forecast(city, d) for d in range(days)],
        "source": "derived deterministically from bundled sample data (data/cities.json)",
    }
    sys.stdout.buffer.write(json.dumps(result, ensure_ascii=False).encode("utf-8") + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

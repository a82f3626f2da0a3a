#!/usr/bin/env python3
"""Drives the exchange's OpenAI-compatible door with the official `openai` client, configured as
any OpenAI user would: only `base_url` and `api_key` (the dev CA is trusted through the standard
SSL_CERT_FILE variable, as for any private CA).

Usage: openai_door.py BASE_URL API_KEY MODEL
Prints one JSON line: what each call returned (or which error class it raised).
Run by the Rust test `an_openai_client_buys_completions_with_a_session_key` (exchange/cli/tests/agent.rs)
with the project's virtualenv (scripts/setup.sh makes it): .tools/py/bin/python
"""

import json
import sys

import openai


def main() -> None:
    base_url, api_key, model = sys.argv[1:4]
    client = openai.OpenAI(base_url=base_url, api_key=api_key)
    report = {}

    report["models"] = sorted(m.id for m in client.models.list())

    # Sampled, as most agent frameworks call by default.
    chat = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=8,
        temperature=0.7,
        seed=7,
    )
    report["chat"] = {
        "content": chat.choices[0].message.content,
        "finish_reason": chat.choices[0].finish_reason,
        "total_tokens": chat.usage.total_tokens,
        "id": chat.id,
    }

    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Say hello again."}],
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage, finish = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage.total_tokens
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    report["stream"] = {"content": text, "finish_reason": finish, "total_tokens": usage}

    completion = client.completions.create(model=model, prompt="Once upon", max_tokens=4)
    report["completion"] = {"text": completion.choices[0].text}

    for name, call in [
        ("logprobs", lambda: client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "x"}], logprobs=True)),
        ("bad_key", lambda: openai.OpenAI(base_url=base_url, api_key="cxs_wrong")
            .chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}])),
        ("unknown_model", lambda: client.chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "x"}])),
    ]:
        try:
            call()
            report[name] = "accepted"
        except openai.APIStatusError as err:
            report[name] = {"class": type(err).__name__, "status": err.status_code,
                            "code": (err.body or {}).get("code") if isinstance(err.body, dict) else None}

    print(json.dumps(report))


if __name__ == "__main__":
    main()

"""The SDK from asyncio: submit several jobs at once, read them back, cancel them.

Configured like `tm.Client`: TRAINMASTER_API_URL / TRAINMASTER_TOKEN, or ~/.trainmaster/config.
"""

import asyncio

import trainmaster as tm


async def main() -> None:
    async with tm.AsyncClient() as client:  # closes its connections on the way out
        jobs = await asyncio.gather(
            *(
                client.submit(name=f"async-{lr}", entrypoint="builtin:mlp", config={"epochs": 1, "lr": lr})
                for lr in (0.1, 0.01, 0.001)
            )
        )
        for job in jobs:
            print("submitted", job.name, job.status.value)
        async for listed in client.list(status="queued", limit=10):
            if listed.id in {job.id for job in jobs}:
                print("queued", listed.name, listed.queue_position)
        for job in jobs:
            await job.cancel()
            print(job.name, [event.status.value for event in await job.events() if event.status])


asyncio.run(main())

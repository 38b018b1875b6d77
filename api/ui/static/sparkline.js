// A tiny line on a canvas for the jobs table; no library needed for 60 points.

export function mainMetric(latest) {
  if (!latest) return null;
  const names = Object.keys(latest).filter((n) => n !== "step" && typeof latest[n] === "number");
  const preferred = ["loss", "train_loss", "train/loss", "val_loss"].find((n) => names.includes(n));
  return preferred || names.find((n) => !/^(sys|report|coll)\//.test(n)) || null;
}

export function drawSparkline(canvas, values) {
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  canvas.dataset.points = String(values.length);
  if (values.length < 2) return;
  const low = Math.min(...values);
  const high = Math.max(...values);
  const span = high - low || 1;
  ctx.strokeStyle = "#2563eb";
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  values.forEach((value, i) => {
    const x = (i / (values.length - 1)) * (canvas.width - 2) + 1;
    const y = canvas.height - 2 - ((value - low) / span) * (canvas.height - 4);
    if (i === 0) ctx.moveTo(x, y);
    else ctx.lineTo(x, y);
  });
  ctx.stroke();
}

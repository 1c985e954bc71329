
document.addEventListener("toggle", (e) => {
  if (e.target.open) document.querySelectorAll("details[open]").forEach((d) => { if (d !== e.target) d.open = false; });
}, true);

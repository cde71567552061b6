// Opens the profile the URL names (#/dashboard?profile=<id>), or the last one opened, as soon
// as the page starts: the server answers while the page's modules still load and parse.
// app.js takes the answer over (window.__opening) and asks again while it is in progress.
(() => {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  let id = params.get("profile");
  try { id = id || localStorage.getItem("profileId"); } catch { /* storage refused */ }
  if (!id) return;
  const answer = fetch(`/api/profiles/open?id=${encodeURIComponent(id)}`, {
    method: "POST",
    headers: { "X-Trainium-UI": "1" },
  });
  answer.catch(() => {}); // app.js reports a failure when it takes the answer
  window.__opening = { id, answer };
})();

// The dashboard's shell: sign-in, the hash router (#/jobs, #/jobs/<id>, #/compare, #/cluster),
// and the banner that says when Ray cannot be reached (history still loads from PostgreSQL).

import { api, onSignedOut, token, tokenWorks } from "./api.js";
import { replace } from "./dom.js";
import { clusterPage } from "./pages/cluster.js";
import { comparePage } from "./pages/compare.js";
import { jobPage } from "./pages/job.js";
import { jobsPage } from "./pages/jobs.js";

const view = document.getElementById("view");
const signIn = document.getElementById("sign-in");
const signOut = document.getElementById("sign-out");
const banner = document.getElementById("ray-banner");
let teardown = null;
let bannerTimer = null;

const routes = [
  [/^#\/jobs\/([0-9a-f-]{36})$/, (match, params) => jobPage(view, match[1], params)],
  [/^#\/compare$/, (match, params) => comparePage(view, params)],
  [/^#\/cluster$/, () => clusterPage(view)],
  [/^#\/jobs$/, (match, params) => jobsPage(view, params)],
];

function route() {
  if (teardown) teardown();
  teardown = null;
  if (!token.get()) {
    showSignIn();
    return;
  }
  signIn.hidden = true;
  view.hidden = false;
  signOut.hidden = false;
  const [path, query = ""] = (location.hash || "#/jobs").split("?");
  const params = new URLSearchParams(query);
  for (const link of document.querySelectorAll("[data-nav]")) {
    link.classList.toggle("active", path.startsWith(`#/${link.dataset.nav}`));
  }
  for (const [pattern, render] of routes) {
    const match = path.match(pattern);
    if (match) {
      teardown = render(match, params) || null;
      return;
    }
  }
  location.replace("#/jobs");
}

function showSignIn(message = "") {
  view.hidden = true;
  signOut.hidden = true;
  banner.hidden = true;
  replace(view);
  signIn.hidden = false;
  replace(document.getElementById("sign-in-error"), message);
  document.getElementById("token-input").focus();
}

async function submitToken(event) {
  event.preventDefault();
  const input = document.getElementById("token-input");
  const candidate = input.value.trim();
  const error = document.getElementById("sign-in-error");
  try {
    if (!(await tokenWorks(candidate))) {
      replace(error, "That token was refused (401). Check it and try again.");
      return;
    }
  } catch (problem) {
    replace(error, `Cannot reach the API: ${problem.message}`);
    return;
  }
  input.value = "";
  token.set(candidate);
  checkRay();
  route();
}

async function checkRay() {
  clearTimeout(bannerTimer);
  if (!token.get()) return;
  try {
    const cluster = await api("/v1/cluster");
    banner.hidden = cluster.reachable;
    replace(
      banner,
      cluster.reachable
        ? ""
        : `Ray cannot be reached (${cluster.error || "no answer"}). Jobs will not start or update until it is back; history below comes from the database.`,
    );
  } catch (problem) {
    if (problem.status !== 401) {
      banner.hidden = false;
      replace(banner, `The API cannot be reached: ${problem.message}`);
    }
  }
  bannerTimer = setTimeout(checkRay, 10000);
}

onSignedOut(() => showSignIn("Your token was refused (401); sign in again."));
signOut.addEventListener("click", () => {
  token.clear();
  if (teardown) teardown();
  teardown = null;
  showSignIn();
});
document.getElementById("sign-in-form").addEventListener("submit", submitToken);
window.addEventListener("hashchange", route);
checkRay();
route();

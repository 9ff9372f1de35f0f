// Live updates without a build step: every element with data-poll is brought up to date with
// the server-rendered fragment at that URL every few seconds, in place. Polling pauses while
// the page is hidden, and a failed fetch keeps what is shown.
//
// In place, not replaced: replacing the element's HTML took the keyboard focus to the page's
// start and dropped any text selection every refresh (nobody could Tab to an approval or copy an
// id). The fresh fragment is merged into the live one node by node: an element with an id or a
// data-key is matched by it (a focused approval's link stays that approval's link when a row
// is added above it), others by position and tag; only attributes and text that changed are
// written, and a text the user has selected is left as it is until the selection ends.
//
// A <details> element's open state is the user's: a refresh neither opens nor closes it.
//
// Signed out (in another tab, or the session ended): the fragment's request is redirected to
// the sign-in page. The redirect is not followed (that page was put inside the list); the page
// stops polling and says so in one line with a link to sign in again.
(function () {
  "use strict";
  var PERIOD_MS = 2000;

  function keyOf(node) {
    if (node.nodeType !== Node.ELEMENT_NODE) return null;
    return node.getAttribute("data-key") || node.id || null;
  }

  function alike(a, b) {
    return a.nodeType === b.nodeType && a.nodeName === b.nodeName && keyOf(a) === keyOf(b);
  }

  function selected(node) {
    var selection = window.getSelection();
    if (!selection || selection.isCollapsed) return false;
    for (var i = 0; i < selection.rangeCount; i++) {
      if (selection.getRangeAt(i).intersectsNode(node)) return true;
    }
    return false;
  }

  // Whether an attribute is the user's, not the server's: a <details> the user opened or closed
  // (a timeline's entry) stays so across refreshes.
  function users(element, name) {
    return name === "open" && element.nodeName === "DETAILS";
  }

  function mergeAttributes(live, fresh) {
    var i, attribute;
    for (i = live.attributes.length - 1; i >= 0; i--) {
      attribute = live.attributes[i];
      if (!fresh.hasAttribute(attribute.name) && !users(live, attribute.name)) {
        live.removeAttribute(attribute.name);
      }
    }
    for (i = 0; i < fresh.attributes.length; i++) {
      attribute = fresh.attributes[i];
      if (live.getAttribute(attribute.name) !== attribute.value && !users(live, attribute.name)) {
        live.setAttribute(attribute.name, attribute.value);
      }
    }
  }

  // A timeline's bar links to its entry (#id of a <details>): following it opens the entry.
  function openLinked() {
    var id = decodeURIComponent(location.hash.slice(1));
    var target = id && document.getElementById(id);
    if (target && target.nodeName === "DETAILS") {
      target.open = true;
      target.scrollIntoView({ block: "nearest" });
    }
  }

  function merge(live, fresh) {
    if (live.nodeType !== Node.ELEMENT_NODE) {
      if (live.nodeValue !== fresh.nodeValue && !selected(live)) live.nodeValue = fresh.nodeValue;
      return;
    }
    mergeAttributes(live, fresh);
    mergeChildren(live, fresh);
  }

  // Makes live's children fresh's, reusing live's nodes: each fresh child is matched (by key,
  // else the live child at the cursor if alike), moved to the cursor if it is elsewhere, and
  // merged; an unmatched fresh child is moved in; live children left unmatched are removed.
  function mergeChildren(live, fresh) {
    var keyed = new Map();
    var child, key, next, match;
    for (child = live.firstChild; child; child = child.nextSibling) {
      key = keyOf(child);
      if (key !== null && !keyed.has(key)) keyed.set(key, child);
    }
    var cursor = live.firstChild;
    for (child = fresh.firstChild; child; child = next) {
      next = child.nextSibling;
      key = keyOf(child);
      match = null;
      if (key !== null) {
        match = keyed.get(key) || null;
        keyed.delete(key);
        if (match !== null && !alike(match, child)) match = null;
      } else if (cursor !== null && alike(cursor, child)) {
        match = cursor;
      }
      if (match === null) {
        live.insertBefore(child, cursor);
        continue;
      }
      if (match === cursor) cursor = cursor.nextSibling;
      else live.insertBefore(match, cursor);
      merge(match, child);
    }
    while (cursor !== null) {
      next = cursor.nextSibling;
      live.removeChild(cursor);
      cursor = next;
    }
  }

  function update(element, html) {
    var fresh = document.createElement("template");
    fresh.innerHTML = html;
    var focused = document.activeElement;
    var inside = focused !== null && focused !== document.body && element.contains(focused);
    mergeChildren(element, fresh.content);
    // A focused element the merge had to move (its row went up or down) lost the focus.
    if (inside && focused.isConnected && document.activeElement !== focused) {
      focused.focus({ preventScroll: true });
    }
  }

  function signedOut(element) {
    element.classList.add("stale");
    if (document.getElementById("signed-out")) return;
    var notice = document.createElement("p");
    notice.id = "signed-out";
    notice.className = "notice";
    notice.setAttribute("role", "alert");
    notice.append("You are signed out: this page no longer updates. ");
    var link = document.createElement("a");
    link.href = "/login";
    link.textContent = "Sign in again";
    notice.append(link);
    var main = document.querySelector("main") || document.body;
    main.insertBefore(notice, main.firstChild);
  }

  function poll(element) {
    function again() { setTimeout(tick, PERIOD_MS); }
    function tick() {
      if (document.hidden) return again();
      fetch(element.getAttribute("data-poll"), { credentials: "same-origin", redirect: "manual" })
        .then(function (response) {
          if (response.type === "opaqueredirect" || response.status === 401) {
            signedOut(element);
            return; // no more polling: a sign-in in this tab loads a new page
          }
          return (response.ok ? response.text() : Promise.resolve(null)).then(function (html) {
            if (html !== null) update(element, html);
            again();
          });
        })
        .catch(again);
    }
    again();
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-poll]").forEach(poll);
    openLinked();
  });
  window.addEventListener("hashchange", openLinked);
})();

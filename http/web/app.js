// The feed's web page: a client of the service's public HTTP API and nothing
// else. Plain modern JavaScript with no build step; every request goes to the
// page's own origin.

const main = document.getElementById('main');
const announcer = document.getElementById('announce');
const TOKEN_KEY = 'feed.token';
const PAGES_MAX = 100; // the most pages a list is read to its end

const state = {
  token: null,
  me: null,
  // position is the newest log position the person's own commands or the
  // live stream reported: reads wait for it (X-Min-Position), so the page
  // shows the person's own writes.
  position: null,
  stream: null,
  live: 'off', // connecting, on, unavailable
  retry: 0,
  activityUnseen: 0,
  following: null, // the ids the person follows, once read
  view: {}, // the current view's live handlers and its clean-up
  shown: 0, // counts the views shown, so that a late answer finds its view gone
};

// ---- small helpers ----

// h makes an element; children that are strings become text, never markup.
function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (v == null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k === 'text') el.textContent = v;
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (v === true) el.setAttribute(k, '');
    else el.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c != null && c !== false) el.append(c);
  }
  return el;
}

function plural(n, one, many = one + 's') {
  return `${n} ${n === 1 ? one : many}`;
}

function timeEl(iso) {
  const d = new Date(iso);
  return h('time', { datetime: iso, class: 'muted' }, isNaN(d) ? iso : d.toLocaleString());
}

function announce(text) {
  announcer.textContent = '';
  // A change a moment later is read out even when the text repeats.
  setTimeout(() => { announcer.textContent = text; }, 50);
}

// newer is the later of two log positions (decimal strings; opaque otherwise).
function newer(a, b) {
  if (!a) return b;
  if (!b) return a;
  if (/^\d+$/.test(a) && /^\d+$/.test(b)) return BigInt(a) >= BigInt(b) ? a : b;
  return b;
}

function byIdDesc(a, b) {
  const x = BigInt(a.id), y = BigInt(b.id);
  return x > y ? -1 : x < y ? 1 : 0;
}

function randomKey() {
  const b = new Uint8Array(16);
  crypto.getRandomValues(b);
  return Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
}

// ---- the API ----

class APIError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// api sends one request to the service. A command carries an Idempotency-Key
// and is retried with it while the service answers 503 or 504, which the
// contract makes safe; its position becomes the reads' X-Min-Position.
async function api(method, path, { json, form } = {}) {
  const headers = {};
  if (state.token) headers.Authorization = `Bearer ${state.token}`;
  let body;
  if (json !== undefined) {
    headers['Content-Type'] = 'application/json';
    body = JSON.stringify(json);
  } else if (form) {
    body = form;
  }
  const command = method !== 'GET';
  if (command) headers['Idempotency-Key'] = randomKey();
  else if (state.position) headers['X-Min-Position'] = state.position;

  for (let attempt = 0; ; attempt++) {
    let resp;
    try {
      resp = await fetch(path, { method, headers, body });
    } catch {
      if (command && attempt < 2) { await sleep(1000); continue; }
      throw new APIError(0, 'network', 'The service did not answer. Check the connection and try again.');
    }
    if (command && attempt < 2 && (resp.status === 503 || resp.status === 504)) {
      const after = Number(resp.headers.get('Retry-After')) || 1;
      await sleep(Math.min(after, 5) * 1000);
      continue;
    }
    let data = null;
    const type = resp.headers.get('Content-Type') || '';
    if (type.includes('json')) data = await resp.json().catch(() => null);
    if (!resp.ok) {
      const e = data && data.error;
      const err = new APIError(resp.status, e ? e.code : 'http_' + resp.status,
        e ? e.message : `The service answered ${resp.status}.`);
      if (resp.status === 401 && state.token && path !== '/dev/token') {
        signOut(err.message);
      }
      throw err;
    }
    if (data && data.position) state.position = newer(state.position, data.position);
    return data;
  }
}

// showError puts an error in el as the service's error body says it.
function showError(el, err) {
  el.textContent = err instanceof APIError ? err.message : String(err);
  el.dataset.code = err instanceof APIError ? err.code : 'client';
}

function errorBox(id) {
  return h('p', { id, class: 'error', role: 'alert' });
}

// ---- signing in ----

function tokenSubject(token) {
  const parts = token.split('.');
  if (parts.length !== 3) return null;
  try {
    const json = atob(parts[1].replace(/-/g, '+').replace(/_/g, '/'));
    const sub = JSON.parse(json).sub;
    return typeof sub === 'string' && /^\d+$/.test(sub) ? sub : null;
  } catch {
    return null;
  }
}

function signIn(token) {
  const me = tokenSubject(token);
  if (!me) throw new APIError(0, 'client', 'That is not a token: its subject is not a user id.');
  state.token = token;
  state.me = me;
  state.position = null;
  state.following = null;
  localStorage.setItem(TOKEN_KEY, token);
  document.getElementById('nav').hidden = false;
  document.getElementById('nav-me').href = `#/users/${me}`;
  connectStream();
}

function signOut(reason) {
  localStorage.removeItem(TOKEN_KEY);
  state.token = state.me = state.position = state.following = null;
  disconnectStream();
  document.getElementById('nav').hidden = true;
  route(reason);
}

function viewSignIn(reason) {
  const devError = errorBox('dev-error');
  const tokenError = errorBox('token-error');
  const user = h('input', { id: 'dev-user', name: 'user', inputmode: 'numeric', autocomplete: 'username', required: true, 'aria-describedby': 'dev-hint' });
  const token = h('textarea', { id: 'token', name: 'token', required: true, rows: 3, spellcheck: 'false' });
  render('Sign in',
    reason ? h('p', { class: 'error', role: 'alert', text: reason }) : null,
    h('section', { class: 'panel', 'aria-labelledby': 'dev-title' },
      h('h2', { id: 'dev-title' }, 'Development sign-in'),
      h('p', { id: 'dev-hint', class: 'hint' }, 'In development mode (feed dev) any user id signs in, with no password.'),
      h('form', {
        id: 'dev-sign-in',
        onsubmit: async (e) => {
          e.preventDefault();
          devError.textContent = '';
          try {
            const t = await api('POST', '/dev/token', { json: { user_id: user.value.trim() } });
            signIn(t.token);
            go('#/');
          } catch (err) { showError(devError, err); }
        },
      },
      h('label', { for: 'dev-user' }, 'User id'),
      h('div', { class: 'row' }, user, h('button', { type: 'submit' }, 'Sign in')),
      devError)),
    h('section', { class: 'panel', 'aria-labelledby': 'token-title' },
      h('h2', { id: 'token-title' }, 'Sign in with a token'),
      h('form', {
        id: 'token-sign-in',
        onsubmit: async (e) => {
          e.preventDefault();
          tokenError.textContent = '';
          try {
            signIn(token.value.trim());
            await api('GET', '/feed'); // the service checks the token
            go('#/');
          } catch (err) { showError(tokenError, err); }
        },
      },
      h('label', { for: 'token' }, 'Bearer token'),
      token,
      h('button', { type: 'submit' }, 'Use token'),
      tokenError)));
}

// ---- live updates (GET /stream) ----

function setLive(s) {
  state.live = s;
  for (const el of document.querySelectorAll('.live-state')) el.textContent = liveText();
}

function liveText() {
  switch (state.live) {
    case 'on': return 'Live: new posts and activity appear as they happen.';
    case 'connecting': return 'Connecting to live updates…';
    case 'unavailable': return 'Live updates are unavailable: reload to see what is new.';
    default: return '';
  }
}

function disconnectStream() {
  if (state.stream) state.stream.close();
  state.stream = null;
  setLive('off');
}

// connectStream follows GET /stream. EventSource reconnects by itself and
// resumes with Last-Event-ID; a stream it gives up on (an error status) is
// opened anew later, after which the views read everything again.
function connectStream() {
  if (!state.token || state.stream || typeof EventSource === 'undefined') return;
  const es = new EventSource(`/stream?access_token=${encodeURIComponent(state.token)}`);
  state.stream = es;
  setLive('connecting');
  let resumed = state.retry > 0;
  es.onopen = () => {
    state.retry = 0;
    setLive('on');
    if (resumed) { resumed = false; state.view.onReset?.(); }
  };
  es.onerror = () => {
    if (es.readyState !== EventSource.CLOSED) { setLive('connecting'); return; }
    state.stream = null;
    setLive('unavailable');
    const wait = Math.min(60, 5 * 2 ** state.retry++);
    setTimeout(connectStream, wait * 1000);
  };
  const on = (type, fn) => es.addEventListener(type, (ev) => {
    if (es !== state.stream) return;
    if (ev.lastEventId) state.position = newer(state.position, ev.lastEventId);
    let data = null;
    try { data = ev.data ? JSON.parse(ev.data) : null; } catch { return; }
    fn(data);
  });
  on('post', (post) => state.view.onPost?.(post));
  on('delete', (d) => removePost(d.id));
  on('follow', (d) => { state.following?.add(d.user_id); state.view.onFeedChanged?.(); });
  on('unfollow', (d) => { state.following?.delete(d.user_id); state.view.onFeedChanged?.(); });
  on('activity', (item) => {
    if (state.view.onActivity) state.view.onActivity(item);
    else setActivityBadge(state.activityUnseen + 1);
  });
  on('reset', () => state.view.onReset?.());
}

// removePost takes a deleted post off every list on the page.
function removePost(id) {
  const gone = document.querySelectorAll(`[data-post-id="${CSS.escape(id)}"]`);
  for (const el of gone) {
    if (el.classList.contains('post-page')) {
      el.replaceChildren(h('p', { id: 'post-deleted' }, 'This post was deleted.'));
    } else {
      el.remove();
    }
  }
  state.view.onDelete?.(id);
  if (gone.length) announce('A post was deleted.');
}

function setActivityBadge(n) {
  state.activityUnseen = n;
  const badge = document.getElementById('activity-badge');
  badge.hidden = n === 0;
  badge.textContent = n ? String(n) : '';
  badge.setAttribute('aria-label', n ? `${plural(n, 'new item')}` : '');
}

// ---- views ----

// render replaces the page's content and moves focus to its heading, so that
// keyboard and screen reader users start at the top of what changed.
function render(title, ...children) {
  const heading = h('h1', { tabindex: '-1' }, title);
  main.replaceChildren(heading, ...children.flat().filter(Boolean));
  document.title = `${title} · feed`;
  heading.focus({ preventScroll: false });
}

// pager reads a list page by page: on a click of its "more" button, and when
// that button scrolls into view. next(cursor) reads one page and returns its
// next_cursor and has_more; the pager stops at the end and says so.
function pager(next, { more = 'Load more', end = 'That is all.', id }) {
  const button = h('button', { type: 'button', class: 'more secondary', id: id && `${id}-more` }, more);
  const endNote = h('p', { class: 'end', id: id && `${id}-end`, hidden: true }, end);
  const error = errorBox(id && `${id}-error`);
  let cursor = null;
  let loading = false;
  let done = false;
  const observer = new IntersectionObserver((entries) => {
    if (entries.some((e) => e.isIntersecting)) load();
  }, { rootMargin: '600px 0px' });
  async function load() {
    if (loading || done) return;
    loading = true;
    button.disabled = true;
    button.textContent = 'Loading…';
    error.textContent = '';
    try {
      const page = await next(cursor);
      cursor = page.next_cursor;
      done = !page.has_more || !cursor;
    } catch (err) {
      showError(error, err);
    } finally {
      loading = false;
      button.disabled = false;
      button.textContent = more;
    }
    if (done) {
      observer.disconnect();
      button.hidden = true;
      endNote.hidden = false;
      return;
    }
    // A page shorter than the screen leaves the button in view, which the
    // observer does not report again.
    if (!error.textContent && button.isConnected && button.getBoundingClientRect().top < innerHeight + 600) {
      requestAnimationFrame(load);
    }
  }
  button.addEventListener('click', load);
  return {
    elements: [error, button, endNote],
    start() { observer.observe(button); return load(); },
    stop() { observer.disconnect(); },
  };
}

// mediaStrip shows a post's images; a feed's (link set) load as they come
// near the screen, a post page's at once.
function mediaStrip(post, link) {
  const n = post.media.length;
  const imgs = post.media.map((m, i) => h('img', {
    src: m.url, width: m.width, height: m.height, loading: link ? 'lazy' : 'eager', decoding: 'async',
    alt: `Image ${i + 1} of ${n} by user ${post.user_id}`,
  }));
  if (link) {
    return h('div', { class: 'media' }, imgs.map((img) => h('a', { href: link, tabindex: '-1', 'aria-hidden': 'true' }, img)));
  }
  return h('div', { class: 'media' }, imgs);
}

function postCard(post) {
  const link = `#/posts/${post.id}`;
  return h('article', { class: 'post', dataset: { postId: post.id }, 'aria-label': `Post by user ${post.user_id}` },
    h('header', {},
      h('a', { href: `#/users/${post.user_id}` }, `User ${post.user_id}`),
      timeEl(post.created_at),
      post.edited_at ? h('span', { class: 'muted' }, '(edited)') : null),
    mediaStrip(post, link),
    post.caption ? h('p', { class: 'caption' }, post.caption) : null,
    h('footer', {},
      h('a', { href: link, class: 'open-post' },
        `${plural(post.like_count, 'like')} · ${plural(post.comment_count, 'comment')}`,
        post.media.length > 1 ? ` · ${post.media.length} images` : '')));
}

function viewHome() {
  const list = h('div', { id: 'feed', class: 'posts' });
  const banner = h('button', { id: 'new-posts', class: 'banner', type: 'button', hidden: true });
  const empty = h('div', { id: 'feed-empty', class: 'panel', hidden: true },
    h('p', {}, 'Your home feed is empty: it shows the posts of the people you follow.'),
    profileFinder());
  const seen = new Set();
  const pending = new Map();
  const feed = pager(async (cursor) => {
    const page = await api('GET', '/feed' + (cursor ? `?cursor=${encodeURIComponent(cursor)}` : ''));
    for (const p of page.posts) {
      if (seen.has(p.id)) continue;
      seen.add(p.id);
      pending.delete(p.id);
      list.append(postCard(p));
    }
    empty.hidden = seen.size > 0 || page.has_more;
    updateBanner();
    return page;
  }, { id: 'feed', end: 'You are all caught up: that is every post of the people you follow.' });

  function updateBanner() {
    banner.hidden = pending.size === 0;
    banner.textContent = pending.size ? `Show ${plural(pending.size, 'new post')}` : '';
  }
  banner.addEventListener('click', () => {
    const posts = [...pending.values()].sort(byIdDesc);
    pending.clear();
    updateBanner();
    for (const p of posts.reverse()) {
      seen.add(p.id);
      list.prepend(postCard(p));
    }
    empty.hidden = true;
    const first = list.querySelector('.open-post');
    if (first) first.focus();
    window.scrollTo({ top: 0 });
  });

  render('Home', h('p', { class: 'live-state' }, liveText()), banner, empty, list, feed.elements);
  state.view = {
    onPost(post) {
      if (seen.has(post.id) || post.user_id === state.me) return;
      pending.set(post.id, post);
      updateBanner();
      announce(`${plural(pending.size, 'new post')} in your feed.`);
    },
    onDelete(id) { seen.delete(id); if (pending.delete(id)) updateBanner(); },
    // Follows, unfollows and a reset change which older posts the feed has.
    onFeedChanged: () => { if (window.scrollY < 200) viewHome(); },
    onReset: () => viewHome(),
    dispose: () => feed.stop(),
  };
  feed.start();
}

function profileFinder() {
  const input = h('input', { id: 'find-user', inputmode: 'numeric', required: true });
  return h('form', {
    class: 'find-user',
    onsubmit: (e) => { e.preventDefault(); location.hash = `#/users/${input.value.trim()}`; },
  },
  h('label', { for: 'find-user' }, 'Open a profile by user id'),
  h('div', { class: 'row' }, input, h('button', { type: 'submit' }, 'Open')));
}

function viewCompose() {
  const files = [];
  const urls = new Map();
  const input = h('input', {
    type: 'file', id: 'images', name: 'images', multiple: true,
    accept: 'image/jpeg,image/png,image/gif,image/webp', 'aria-describedby': 'images-hint',
  });
  const previews = h('ul', { id: 'previews', class: 'previews', 'aria-label': 'Chosen images' });
  const count = h('p', { id: 'images-count', class: 'hint', 'aria-live': 'polite' });
  const caption = h('textarea', { id: 'caption', name: 'caption', maxlength: 2200, 'aria-describedby': 'caption-count' });
  const captionCount = h('p', { id: 'caption-count', class: 'hint' }, '0 of 2200 characters');
  const error = errorBox('compose-error');
  const publish = h('button', { type: 'submit', id: 'publish' }, 'Publish');

  function showPreviews() {
    previews.replaceChildren(...files.map((f, i) => {
      if (!urls.has(f)) urls.set(f, URL.createObjectURL(f));
      const img = h('img', { src: urls.get(f), alt: `Preview of ${f.name}` });
      img.addEventListener('error', () => img.replaceWith(h('span', { class: 'muted' }, 'No preview')));
      return h('li', {}, img, h('span', {}, f.name),
        h('button', {
          type: 'button', class: 'secondary', 'aria-label': `Remove ${f.name}`,
          onclick: () => { URL.revokeObjectURL(urls.get(f)); urls.delete(f); files.splice(i, 1); showPreviews(); input.focus(); },
        }, 'Remove'));
    }));
    count.textContent = files.length ? `${plural(files.length, 'image')} chosen.` : 'No image chosen yet.';
  }
  input.addEventListener('change', () => {
    files.push(...input.files);
    input.value = '';
    showPreviews();
  });
  caption.addEventListener('input', () => { captionCount.textContent = `${caption.value.length} of 2200 characters`; });

  const form = h('form', {
    id: 'compose',
    onsubmit: async (e) => {
      e.preventDefault();
      error.textContent = '';
      // The service checks the images (how many, how large, what they are)
      // and its error says what is wrong.
      const body = new FormData();
      if (caption.value) body.append('caption', caption.value);
      for (const f of files) body.append('images', f, f.name);
      publish.disabled = true;
      try {
        const post = await api('POST', '/posts', { form: body });
        announce('Post published.');
        location.hash = `#/posts/${post.id}`;
      } catch (err) {
        showError(error, err);
      } finally {
        publish.disabled = false;
      }
    },
  },
  h('label', { for: 'images' }, 'Images'),
  h('p', { id: 'images-hint', class: 'hint' }, '1 to 10 images: JPEG, PNG, GIF or WebP, up to 5 MiB each. Choose more to add them.'),
  input, count, previews,
  h('label', { for: 'caption' }, 'Caption (optional)'),
  caption, captionCount, error, publish);
  render('New post', form);
  showPreviews();
  state.view = { dispose: () => { for (const u of urls.values()) URL.revokeObjectURL(u); } };
}

async function viewPost(id) {
  const shown = state.shown;
  render('Post');
  const status = errorBox('post-error');
  main.append(status);
  let post;
  try {
    post = await api('GET', `/posts/${id}`);
  } catch (err) {
    showError(status, err);
    return;
  }
  if (shown !== state.shown) return;
  const own = post.user_id === state.me;
  const article = h('article', { class: 'post post-page', dataset: { postId: post.id } });
  const likeButton = h('button', { type: 'button', id: 'like', 'aria-pressed': String(post.has_liked) });
  const likeCount = h('span', { id: 'like-count', 'aria-live': 'polite' });
  const captionEl = h('p', { id: 'post-caption', class: 'caption' });
  const edited = h('span', { class: 'muted', id: 'edited' });
  const actionError = errorBox('action-error');
  const comments = h('ol', { id: 'comments', class: 'comments' });
  const commentCount = h('span', {});

  function show(p) {
    post = p;
    likeButton.setAttribute('aria-pressed', String(p.has_liked));
    likeButton.textContent = p.has_liked ? 'Liked' : 'Like';
    likeButton.setAttribute('aria-label', p.has_liked ? 'Unlike this post' : 'Like this post');
    likeCount.textContent = plural(p.like_count, 'like');
    captionEl.textContent = p.caption;
    captionEl.hidden = !p.caption;
    edited.textContent = p.edited_at ? '(edited)' : '';
    commentCount.textContent = ` (${p.comment_count})`;
  }
  async function refresh() {
    show(await api('GET', `/posts/${id}`));
  }

  likeButton.addEventListener('click', async () => {
    actionError.textContent = '';
    likeButton.disabled = true;
    try {
      await api(post.has_liked ? 'DELETE' : 'POST', `/posts/${id}/like`);
      await refresh();
    } catch (err) {
      showError(actionError, err);
    } finally {
      likeButton.disabled = false;
    }
  });

  const commentsPager = pager(async (cursor) => {
    const page = await api('GET', `/posts/${id}/comments` + (cursor ? `?cursor=${encodeURIComponent(cursor)}` : ''));
    for (const c of page.comments) {
      if (!comments.querySelector(`[data-comment-id="${CSS.escape(c.id)}"]`)) comments.append(commentItem(c));
    }
    return page;
  }, { id: 'comments', more: 'More comments', end: '' });

  const commentText = h('textarea', { id: 'comment-text', name: 'text', maxlength: 2200, required: true, rows: 2 });
  const commentError = errorBox('comment-error');
  const commentForm = h('form', {
    id: 'comment-form',
    onsubmit: async (e) => {
      e.preventDefault();
      commentError.textContent = '';
      try {
        const c = await api('POST', `/posts/${id}/comments`, { json: { text: commentText.value } });
        commentText.value = '';
        await refresh();
        await readCommentsUntil(c.id);
        announce('Comment added.');
      } catch (err) { showError(commentError, err); }
    },
  },
  h('label', { for: 'comment-text' }, 'Add a comment'), commentText,
  h('button', { type: 'submit' }, 'Comment'), commentError);

  // readCommentsUntil reads the comments from the first, oldest, until the
  // one just added, which is the newest.
  async function readCommentsUntil(commentID) {
    let cursor = null;
    const items = [];
    for (let i = 0; i < PAGES_MAX; i++) {
      const page = await api('GET', `/posts/${id}/comments` + (cursor ? `?cursor=${encodeURIComponent(cursor)}` : ''));
      items.push(...page.comments);
      cursor = page.next_cursor;
      if (!page.has_more || !cursor || page.comments.some((c) => c.id === commentID)) break;
    }
    comments.replaceChildren(...items.map(commentItem));
  }

  article.append(
    h('header', {},
      h('a', { href: `#/users/${post.user_id}` }, `User ${post.user_id}`),
      timeEl(post.created_at), edited),
    mediaStrip(post),
    captionEl,
    h('div', { class: 'actions' }, likeButton, likeCount, own ? ownerControls() : null),
    actionError);
  main.append(article,
    h('section', { 'aria-labelledby': 'comments-title' },
      h('h2', { id: 'comments-title' }, 'Comments', commentCount),
      comments, commentsPager.elements, commentForm));
  show(post);
  commentsPager.start();
  state.view = {
    onDelete(deleted) { if (deleted === id) { commentForm.remove(); commentsPager.stop(); } },
    dispose: () => commentsPager.stop(),
  };

  function ownerControls() {
    const controls = h('span', { class: 'owner' });
    const edit = h('button', { type: 'button', id: 'edit', class: 'secondary' }, 'Edit caption');
    const del = h('button', { type: 'button', id: 'delete', class: 'secondary' }, 'Delete post');
    edit.addEventListener('click', () => {
      const text = h('textarea', { id: 'edit-caption', maxlength: 2200 });
      text.value = post.caption;
      const editError = errorBox('edit-error');
      const form = h('form', {
        id: 'edit-form',
        onsubmit: async (e) => {
          e.preventDefault();
          try {
            await api('PATCH', `/posts/${id}`, { json: { caption: text.value } });
            await refresh();
            form.replaceWith(captionEl);
            edit.focus();
            announce('Caption saved.');
          } catch (err) { showError(editError, err); }
        },
      },
      h('label', { for: 'edit-caption' }, 'Caption'), text, editError,
      h('div', { class: 'row' },
        h('button', { type: 'submit' }, 'Save'),
        h('button', { type: 'button', class: 'secondary', onclick: () => { form.replaceWith(captionEl); edit.focus(); } }, 'Cancel')));
      captionEl.replaceWith(form);
      text.focus();
    });
    del.addEventListener('click', () => {
      const confirm = h('button', { type: 'button', id: 'confirm-delete', class: 'danger' }, 'Delete for good');
      const cancel = h('button', { type: 'button', class: 'secondary' }, 'Keep it');
      const ask = h('span', { role: 'group', 'aria-label': 'Delete this post?' }, 'Delete this post? ', confirm, ' ', cancel);
      cancel.addEventListener('click', () => { ask.replaceWith(del); del.focus(); });
      confirm.addEventListener('click', async () => {
        actionError.textContent = '';
        confirm.disabled = true;
        try {
          await api('DELETE', `/posts/${id}`);
          announce('Post deleted.');
          location.hash = `#/users/${state.me}`;
        } catch (err) {
          confirm.disabled = false;
          showError(actionError, err);
        }
      });
      del.replaceWith(ask);
      confirm.focus();
    });
    controls.append(edit, ' ', del);
    return controls;
  }
}

function commentItem(c) {
  return h('li', { dataset: { commentId: c.id } },
    h('a', { href: `#/users/${c.user_id}` }, `User ${c.user_id}`), ' ', timeEl(c.created_at),
    h('p', { class: 'comment-text' }, c.text));
}

// following reads the ids the person follows, once.
async function following() {
  if (state.following) return state.following;
  const ids = new Set();
  let cursor = null;
  for (let i = 0; i < PAGES_MAX; i++) {
    const page = await api('GET', `/users/${state.me}/following` + (cursor ? `?cursor=${encodeURIComponent(cursor)}` : ''));
    for (const u of page.users) ids.add(u);
    cursor = page.next_cursor;
    if (!page.has_more || !cursor) break;
  }
  state.following = ids;
  return ids;
}

async function viewProfile(user, tab = 'posts') {
  const me = user === state.me;
  const tabs = h('nav', { class: 'tabs', 'aria-label': 'Profile' },
    ['posts', 'followers', 'following'].map((t) => h('a', {
      href: `#/users/${user}/${t}`, 'aria-current': t === tab ? 'page' : null,
    }, t[0].toUpperCase() + t.slice(1))));
  const followBox = h('div', { class: 'actions' });
  const followError = errorBox('follow-error');
  render(me ? `Your profile (user ${user})` : `User ${user}`, followBox, followError, tabs);

  if (!me) {
    const button = h('button', { type: 'button', id: 'follow' });
    const show = (f) => {
      button.setAttribute('aria-pressed', String(f));
      button.textContent = f ? 'Following' : 'Follow';
      button.setAttribute('aria-label', f ? `Unfollow user ${user}` : `Follow user ${user}`);
    };
    followBox.append(button);
    button.disabled = true;
    following().then((ids) => { show(ids.has(user)); button.disabled = false; })
      .catch((err) => showError(followError, err));
    button.addEventListener('click', async () => {
      const ids = await following();
      const now = !ids.has(user);
      button.disabled = true;
      followError.textContent = '';
      try {
        await api(now ? 'POST' : 'DELETE', `/users/${user}/follow`);
        if (now) ids.add(user); else ids.delete(user);
        show(now);
        announce(now ? `You follow user ${user}.` : `You no longer follow user ${user}.`);
      } catch (err) {
        showError(followError, err);
      } finally {
        button.disabled = false;
      }
    });
  }

  let list;
  let p;
  if (tab === 'posts') {
    list = h('ul', { id: 'grid', class: 'grid', 'aria-label': 'Posts' });
    p = pager(async (cursor) => {
      const page = await api('GET', `/users/feed?userid=${encodeURIComponent(user)}` + (cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''));
      for (const g of page.posts) {
        const label = `Post of ${new Date(g.created_at).toLocaleString()}: ${plural(g.like_count, 'like')}, ${plural(g.comment_count, 'comment')}`;
        list.append(h('li', { dataset: { postId: g.id } },
          h('a', { href: `#/posts/${g.id}`, 'aria-label': label },
            h('img', { src: g.thumbnail.url, width: g.thumbnail.width, height: g.thumbnail.height, alt: '', loading: 'lazy' }))));
      }
      return page;
    }, { id: 'grid', end: '' });
  } else {
    list = h('ul', { id: tab, class: 'people', 'aria-label': tab === 'followers' ? 'Followers' : 'Following' });
    p = pager(async (cursor) => {
      const page = await api('GET', `/users/${user}/${tab}` + (cursor ? `?cursor=${encodeURIComponent(cursor)}` : ''));
      for (const u of page.users) list.append(h('li', {}, h('a', { href: `#/users/${u}` }, `User ${u}`)));
      return page;
    }, { id: tab, more: 'More people', end: '' });
  }
  main.append(list, p.elements);
  state.view = { dispose: () => p.stop() };
  p.start();
}

function activityText(item) {
  const actor = h('a', { href: `#/users/${item.actor_id}` }, `User ${item.actor_id}`);
  const post = (text) => h('a', { href: `#/posts/${item.post_id}` }, text);
  switch (item.type) {
    case 'follow': return [actor, ' followed you.'];
    case 'like': return [actor, ' liked ', post('your post'), '.'];
    case 'comment': return [actor, ' commented on ', post('your post'), ': ', h('q', {}, item.comment ? item.comment.text : '')];
    default: return [actor, ` did something new (${item.type}).`];
  }
}

function activityItem(item) {
  const thumb = item.thumbnail && item.post_id
    ? h('a', { href: `#/posts/${item.post_id}`, tabindex: '-1', 'aria-hidden': 'true' },
      h('img', { class: 'thumb', src: item.thumbnail.url, alt: '', loading: 'lazy' }))
    : null;
  return h('li', { dataset: { activityId: item.id, type: item.type } },
    h('span', {}, activityText(item), ' ', timeEl(item.created_at)), thumb);
}

function viewActivity() {
  const list = h('ol', { id: 'activity', class: 'activity', 'aria-label': 'What others did' });
  const empty = h('p', { id: 'activity-empty', class: 'muted', hidden: true }, 'Nothing yet: follows, likes and comments of others show here.');
  const p = pager(async (cursor) => {
    const page = await api('GET', '/activity' + (cursor ? `?cursor=${encodeURIComponent(cursor)}` : ''));
    for (const item of page.items) {
      if (!list.querySelector(`[data-activity-id="${CSS.escape(item.id)}"]`)) list.append(activityItem(item));
    }
    empty.hidden = list.children.length > 0;
    return page;
  }, { id: 'activity', end: '' });
  render('Activity', h('p', { class: 'live-state' }, liveText()), empty, list, p.elements);
  setActivityBadge(0);
  state.view = {
    onActivity(item) {
      list.querySelector(`[data-activity-id="${CSS.escape(item.id)}"]`)?.remove();
      list.prepend(activityItem(item));
      empty.hidden = true;
      const who = `User ${item.actor_id}`;
      announce(item.type === 'follow' ? `${who} followed you.` : `${who} ${item.type === 'like' ? 'liked' : 'commented on'} your post.`);
    },
    onReset: () => viewActivity(),
    dispose: () => p.stop(),
  };
  p.start();
}

function viewNotFound() {
  render('Not found', h('p', {}, 'There is no such page here. ', h('a', { href: '#/' }, 'Go home')));
}

// ---- routing ----

const routes = [
  [/^#\/$/, viewHome],
  [/^#\/compose$/, viewCompose],
  [/^#\/activity$/, viewActivity],
  [/^#\/posts\/(\d+)$/, viewPost],
  [/^#\/users\/(\d+)(?:\/(posts|followers|following))?$/, viewProfile],
];

function route(reason) {
  const hash = location.hash || '#/';
  if (!hash.startsWith('#/')) return; // an anchor inside the page, such as the skip link
  state.view.dispose?.();
  state.view = {};
  state.shown++;
  for (const a of document.querySelectorAll('#nav a')) a.removeAttribute('aria-current');
  if (!state.token) {
    viewSignIn(typeof reason === 'string' ? reason : null);
    return;
  }
  for (const [pattern, view] of routes) {
    const m = hash.match(pattern);
    if (!m) continue;
    const current = hash === '#/' ? 'home' : hash === '#/compose' ? 'compose' : hash === '#/activity' ? 'activity'
      : hash.startsWith(`#/users/${state.me}`) ? 'me' : null;
    if (current) document.querySelector(`#nav [data-nav="${current}"]`).setAttribute('aria-current', 'page');
    view(...m.slice(1).filter((x) => x !== undefined));
    return;
  }
  viewNotFound();
}

// go shows the view of hash, also when it is the one shown.
function go(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

document.getElementById('sign-out').addEventListener('click', () => { signOut(); go('#/'); });
document.querySelector('.skip').addEventListener('click', (e) => { e.preventDefault(); main.focus(); });
window.addEventListener('hashchange', route);

const saved = localStorage.getItem(TOKEN_KEY);
if (saved && tokenSubject(saved)) signIn(saved);
route();

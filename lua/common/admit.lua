-- The end of a window check or peek: every window admits the call (a
-- denial has returned already); the reply names the tightest window.
return reply(1, tight, 0, 0)

ALTER TABLE posts RESET (fillfactor);
ALTER TABLE post_media ADD CONSTRAINT post_media_post_id_fkey FOREIGN KEY (post_id) REFERENCES posts (id);
